"""Load and strictly validate a protocol file into a frozen Protocol; restrict it to a sub-grid."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from .errors import ProtocolError, UserError
from .paths import RESERVED_NAMES, is_reserved_name, protocol_dirs
from .pretrain import PretrainError, PretrainKind, parse_pretrain
from .specs import PRECISIONS, ContinualSpec, DatasetSpec, MethodSpec, Protocol, TrainingSpec
from .validate import MAX_SEED, Validator, quoted_number, show
from .vocabulary import (
    DATASETS,
    MODELS,
    NPZ_PREFIX,
    OPTIMIZERS,
    REGIME_GRAMMAR,
    USER_DATA_DEFAULT_MODEL,
    Family,
    Scenario,
    is_dataset_name,
    regime_error,
    regime_family,
    regime_problem,
    runs_under_family,
    sample_shape_problem,
)
from .yamlfile import read_yaml

PROTOCOL_KEYS = ("name", "version", "description", "scenario", "pretrain", "plugins", "datasets", "regimes",
                 "methods", "task_orders", "seeds", "training", "evaluation", "resources")
REQUIRED_KEYS = ("name", "version", "datasets", "regimes", "methods")
DATASET_ENTRY_KEYS = ("name", "n_tasks", "classes_per_task", "model")
METHOD_KEYS = ("name", "label", "hparams", "regimes")
ORDER_KEYS = ("count", "seed", "orders")
TRAINING_KEYS = tuple(f.name for f in dataclasses.fields(TrainingSpec))
RESOURCE_KEYS = ("num_cpus", "num_gpus")
EVALUATION_KEYS = ("batch_size", "every", "subsample")
MAX_ORDERS = 1000


def available_protocols() -> list[str]:
    """Names of the protocols found in the protocol folders."""
    names = {p.stem for d in protocol_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def resolve_protocol_path(name_or_path: str) -> Path:
    """A path to an existing file, or a protocol name looked up in the protocol folders."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ProtocolError(f"{name_or_path}: no such protocol file")
        return path
    for folder in protocol_dirs():
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    raise ProtocolError(f"--protocol: unknown protocol {name_or_path!r}; allowed: "
                        f"{', '.join(available_protocols()) or '(none found)'} or a path to a .yaml file")


def load_protocol(name_or_path: str, registry) -> Protocol:
    """Read, validate and freeze a protocol; every mistake raises ProtocolError.

    `registry` maps method names to adapters (anything with `.defaults`): the methods a
    protocol may list and the hyperparameters each accepts.
    """
    import yaml

    path = resolve_protocol_path(name_or_path)
    try:
        raw = read_yaml(path.read_text(), str(path), ProtocolError)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ProtocolError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{path}: cannot read: {exc}") from None
    except RecursionError:
        raise ProtocolError(f"{path}: nested too deeply to be a protocol") from None
    protocol = parse_protocol(raw, str(path), registry)
    notes = name_reuse(protocol, raw, path)
    return dataclasses.replace(protocol, notes=notes) if notes else protocol


def name_reuse(protocol: Protocol, raw: dict, path: Path) -> tuple[str, ...]:
    """A warning for each other protocol file of the protocol's name (`<name>.yaml` in the protocol
    folders) with other content. Records are kept by name and version (results/<name>/, one board per
    version): another file of the same name and version would put its records into this one's board
    (`leaderboard` has no grid to tell them apart), so that is refused; another version only shares the
    folder, whose views keep versions apart, so that is a warning."""
    import yaml

    notes, seen = [], {path.resolve()}
    for other in (folder / f"{protocol.name}.yaml" for folder in protocol_dirs()):
        try:
            if not other.is_file() or other.resolve() in seen:
                continue
            seen.add(other.resolve())
            theirs = read_yaml(other.read_text(), str(other), ProtocolError)
        except (OSError, UnicodeDecodeError, RecursionError, UserError, yaml.YAMLError):
            continue  # an unreadable file is no protocol of this name
        if theirs == raw or not isinstance(theirs, dict):
            continue
        version = str(theirs.get("version"))
        if version == protocol.version:
            raise ProtocolError(f"{path}: name: protocol {protocol.name!r} version {version} is also {other}, whose "
                                "content differs: the records of both would be counted in one board (records are "
                                "kept by name and version); give it a new version (an override of a protocol "
                                "must carry one), or a name of its own")
        notes.append(f"{path}: protocol name {protocol.name!r} is also that of {other} (version {version}, other "
                     f"content): their records share one results folder, kept apart by version")
    return tuple(notes)


def parse_protocol(raw, source: str, registry) -> Protocol:
    """Validate an already-parsed YAML mapping (see `load_protocol`)."""
    v = _ProtocolValidator(source, ProtocolError)
    v.mapping(raw, "(top level)", PROTOCOL_KEYS, REQUIRED_KEYS)
    name = v.name(raw["name"], "name")
    if is_reserved_name(name):  # its folder under --results would hide the other protocols' records
        v.fail("name", f"{show(name)} is a name of the results folder's layout; allowed: any valid name "
                       f"but {', '.join(RESERVED_NAMES)} (in any case)")
    version = v.version(raw["version"])
    plugin_files = v.plugins(raw.get("plugins", []))
    registry = v.with_plugins(registry, plugin_files)  # their names are known from here on
    datasets, written = v.datasets(raw["datasets"])
    regimes = v.regimes(raw["regimes"], datasets)
    scenario = Scenario(v.choice(raw.get("scenario", Scenario.TASK_IL), "scenario", tuple(Scenario)))
    methods = v.methods(raw["methods"], registry, regimes, scenario)
    orders, order_seed = v.task_orders(raw.get("task_orders", {"count": 1, "seed": 0}), datasets)
    try:
        pretrain = parse_pretrain(raw.get("pretrain", PretrainKind.FIRST_TASK), source, Path(source).resolve().parent)
        for d in datasets:
            pretrain.for_dataset(d.name).check_fits(d.model, d.name, source)
    except PretrainError as exc:  # one kind of protocol mistake
        raise ProtocolError(str(exc)) from None
    return Protocol(
        name=name, version=version, description=v.string(raw.get("description", ""), "description"),
        scenario=scenario, pretrain=pretrain,
        datasets=datasets, regimes=regimes, methods=methods, task_orders=orders,
        order_seed=order_seed, seeds=v.seeds(raw.get("seeds", [0])),
        training=v.training(raw.get("training", {})),
        eval_batch_size=v.evaluation(raw.get("evaluation", {})), continual=v.continual(raw.get("evaluation", {})),
        source=source,
        resources=v.resources(raw.get("resources", {})), written_names=written, plugin_files=plugin_files)


class _ProtocolValidator(Validator):
    """The protocol's sections, checked with the shared Validator's type and value checks."""

    def hparam(self, value, key, adapter, name, method: str = ""):
        """A hyperparameter of one of the JSON types its default (or the adapter) allows, within the
        range the adapter declares for it (`hparam_ranges`; none declared: any value of the type)."""
        value = self._hparam_kind(value, key, adapter, name)
        allowed = getattr(adapter, "hparam_ranges", {}).get(name)
        if allowed is None:
            return value
        integer = isinstance(value, int) and not isinstance(value, bool)
        return self.in_range(value, key, allowed, integer, f" for method {method}" if method else "")

    def _hparam_kind(self, value, key, adapter, name):
        self.plain(value, key)
        default = adapter.defaults[name]
        kinds = tuple(getattr(adapter, "hparam_types", {}).get(name, ())) or _kinds_of(default)
        if kinds is None:
            return value  # a null default says nothing about the type: the adapter checks it
        if float in kinds and not isinstance(value, bool) and isinstance(value, int):
            return float(value)  # 1 and 1.0 are one setting, with one run id
        if any(_is_kind(value, k) for k in kinds):
            return value
        self.fail(key, f"{show(value)} is not allowed; allowed: {' or '.join(_KIND_NAMES[k] for k in kinds)} "
                       f"(the default is {show(default)}){quoted_number(value)}")

    def version(self, value):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value).strip() == "":
            self.fail("version", f"expected a version string such as \"1\" or \"1.0\", got {show(value)}")
        return str(value)

    def plugins(self, value) -> tuple[str, ...]:
        """`plugins:` paths of plug-in files, relative to the protocol file; absolute paths out."""
        if not isinstance(value, list):
            self.fail("plugins", f"expected a list of .py paths, got {show(value)}")
        files = []
        for i, entry in enumerate(value):
            path = Path(self.string(entry, f"plugins[{i}]")).expanduser()
            path = path if path.is_absolute() else Path(self.source).resolve().parent / path
            if path.suffix != ".py" or not path.is_file():
                self.fail(f"plugins[{i}]", f"{show(entry)}: no such Python file ({path}); allowed: the path of a "
                                           ".py plug-in file, relative to the protocol file")
            files.append(str(path.resolve()))
        return tuple(files)

    def with_plugins(self, registry, files):
        """The registry with the plug-in files loaded (the caller's registry knows how: `extended`)."""
        if not files:
            return registry
        if not hasattr(registry, "extended"):
            self.fail("plugins", "this caller's registry cannot load plug-in files; load the protocol with "
                                 "harness.api.registry.get_registry()")
        try:
            return registry.extended(files)
        except UserError as exc:
            self.fail("plugins", str(exc))

    def datasets(self, value):
        out, written = [], {}
        for i, entry in enumerate(self.nonempty_list(value, "datasets")):
            key = f"datasets[{i}]"
            if isinstance(entry, str):
                entry = {"name": entry}
            self.mapping(entry, key, DATASET_ENTRY_KEYS, ("name",))
            name = self.string(entry["name"], f"{key}.name")
            if not is_dataset_name(name):
                self.fail(f"{key}.name", f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}, npz:PATH")
            if name.startswith(NPZ_PREFIX):
                resolved = self.npz_name(name, f"{key}.name")
                written[name], name = resolved, resolved
            facts = DATASETS.get(name)
            n_classes, default_model = (facts.n_classes, facts.default_model) if facts else \
                (None, USER_DATA_DEFAULT_MODEL)
            n_tasks = self.integer(entry.get("n_tasks", 5), f"{key}.n_tasks", 1)
            if "classes_per_task" not in entry and n_classes and n_classes % n_tasks:
                divisors = [k for k in range(1, n_classes + 1) if n_classes % k == 0]
                self.fail(f"{key}.n_tasks", f"{n_classes} classes of {name} do not divide into {n_tasks} tasks; "
                                            f"allowed: one of {divisors}, or set classes_per_task")
            default_cpt = n_classes // n_tasks if n_classes else 2
            cpt = self.integer(entry.get("classes_per_task", default_cpt), f"{key}.classes_per_task", 1)
            model = self.choice(entry.get("model", default_model), f"{key}.model", tuple(MODELS))
            if facts and facts.sample_shape:  # else known once loaded: planning checks it (execution/plan.py)
                self.fits(model, name, facts.sample_shape, f"{key}.model")
            if n_classes is not None and n_tasks * cpt > n_classes:
                self.fail(key, f"{n_tasks} tasks x {cpt} classes = {n_tasks * cpt} classes, but {name} has "
                               f"{n_classes}; allowed: n_tasks * classes_per_task <= {n_classes}")
            out.append(DatasetSpec(name, n_tasks, cpt, model))
        if len({d.name for d in out}) != len(out):
            self.fail("datasets", "a dataset is listed twice")
        return tuple(out), written

    def fits(self, model: str, dataset: str, shape, key: str) -> None:
        """Backbone `model` can take `dataset`'s samples (its declared `accepts`)."""
        problem = sample_shape_problem(model, dataset, shape)
        if problem:
            self.fail(key, problem)

    def npz_name(self, name: str, key: str) -> str:
        """`npz:PATH` with PATH absolute: a relative path is relative to the protocol file."""
        raw = name[len(NPZ_PREFIX):]
        try:
            path = Path(raw).expanduser()
            if not path.is_absolute():
                path = Path(self.source).resolve().parent / path
            return NPZ_PREFIX + str(path.resolve())
        except (OSError, RuntimeError, ValueError) as exc:  # ~nobody, NUL byte, a loop of links
            self.fail(key, f"{show(name)} is not a usable path ({exc}); allowed: npz:PATH to an .npz file")

    def regimes(self, value, datasets):
        out = []
        for i, regime in enumerate(self.nonempty_list(value, "regimes")):
            if not isinstance(regime, str):
                self.fail(f"regimes[{i}]", f"unknown regime {show(regime)}; allowed: {REGIME_GRAMMAR}")
            if regime_error(regime):  # one line: the name and what is allowed (a depth it takes, the grammar)
                self.fail(f"regimes[{i}]", regime_error(regime))
            for d in datasets:
                problem = regime_problem(regime, d.model, d.name)
                if problem:
                    self.fail(f"regimes[{i}]", problem)
            out.append(regime)
        if len(set(out)) != len(out):
            self.fail("regimes", "a regime is listed twice")
        return tuple(out)

    def method_regimes(self, entry, key, name, adapter, regimes) -> tuple:
        """The protocol regimes a method runs on (`regimes:` of its entry, else all); each must be a
        family the method runs faithfully on, else the pair is refused here (never approximated)."""
        listed = entry.get("regimes")
        if listed is not None:
            listed = self.nonempty_list(listed, f"{key}.regimes")
            for j, r in enumerate(listed):
                if r not in regimes:
                    self.fail(f"{key}.regimes[{j}]", f"{show(r)} is not a regime of this protocol; allowed: "
                                                     f"{', '.join(regimes)}")
        runs_on = tuple(r for r in regimes if listed is None or r in listed)
        families = tuple(getattr(adapter, "regime_families", Family))
        for r in runs_on:
            if not runs_under_family(regime_family(r), families):
                note = getattr(adapter, "regime_note", "") or "its adapter declares so"
                self.fail(key, f"{name} cannot run faithfully under regime {r!r} (family {regime_family(r)}): "
                               f"{note}; allowed: families {', '.join(families)}: list the regimes it runs on in "
                               f"{key}.regimes")
            reason = self.regime_refusal(adapter, name, r, key)
            if reason:
                self.fail(key, f"{name} cannot run faithfully under regime {r!r}: {reason}; list the regimes it "
                               f"runs on in {key}.regimes")
        return runs_on

    def regime_refusal(self, adapter, name, regime, key) -> str | None:
        """The adapter's own reason (`regimes_allowed`) to refuse one regime of a family it runs under, or None."""
        allowed = getattr(adapter, "regimes_allowed", None)
        if allowed is None:
            return None
        try:
            reason = allowed(regime)
        except Exception as exc:  # a submitted declaration's bug is one line, not a traceback
            self.fail(key, f"{name}: its regimes_allowed({regime!r}) raised {type(exc).__name__}: {exc}; allowed: "
                           "a function returning None or a one-clause reason")
        if reason is not None and not isinstance(reason, str):
            self.fail(key, f"{name}: its regimes_allowed({regime!r}) returned {type(reason).__name__}; allowed: "
                           "None or a one-clause reason (str)")
        return " ".join(reason.split()) if reason else None

    def methods(self, value, registry, regimes=(), scenario=Scenario.TASK_IL):
        out = []
        for i, entry in enumerate(self.nonempty_list(value, "methods")):
            key = f"methods[{i}]"
            if isinstance(entry, str):
                entry = {"name": entry}
            self.mapping(entry, key, METHOD_KEYS, ("name",))
            name = self.string(entry["name"], f"{key}.name")
            if name not in registry:
                self.fail(f"{key}.name", f"unknown method {name!r}; allowed: {', '.join(sorted(registry))}")
            label = self.label(entry.get("label", ""), f"{key}.label")
            adapter = registry[name]
            scenarios = tuple(getattr(adapter, "scenarios", Scenario))
            if scenario not in scenarios:
                self.fail(f"{key}.name", f"{name} is defined in {', '.join(scenarios)} only, not in this protocol's "
                                         f"scenario {scenario}; allowed: scenario: {' or '.join(scenarios)}, or "
                                         "another method")
            hparams = entry.get("hparams", {}) or {}
            self.mapping(hparams, f"{key}.hparams", tuple(adapter.defaults) or ("(none)",))
            method = f"{label!r} ({name})" if label else repr(name)
            hparams = {k: self.hparam(v, f"{key}.hparams.{k}", adapter, k, method) for k, v in hparams.items()}
            runs_on = self.method_regimes(entry, key, name, adapter, regimes)
            out.append(MethodSpec(name, {**adapter.defaults, **hparams}, label,
                                  getattr(adapter, "implementation", ""), runs_on))
        displays = [m.display for m in out]
        for d in displays:
            if displays.count(d) > 1:
                self.fail("methods", f"method {d!r} appears twice; give the entries distinct labels")
        return tuple(out)

    def label(self, value, key):
        """A method label `--methods` can choose: its comma-separated, stripped items must give it back."""
        label = self.string(value, key)
        if "," in label or label != label.strip():
            self.fail(key, f"{label!r} could not be chosen with --methods (a comma-separated list of stripped "
                           "names); allowed: a label without ',' and without leading or trailing spaces")
        return label

    def task_orders(self, value, datasets):
        self.mapping(value, "task_orders", ORDER_KEYS)
        seed = self.integer(value.get("seed", 0), "task_orders.seed", 0, MAX_SEED)
        if "orders" in value:
            if "count" in value:
                self.fail("task_orders", "give either count (+ seed) or orders, not both")
            return self._explicit_orders(value["orders"], datasets), seed
        count = self.integer(value.get("count", 1), "task_orders.count", 1, MAX_ORDERS)
        return tuple([None] * count), seed

    def _explicit_orders(self, orders, datasets):
        out = []
        for i, order in enumerate(self.nonempty_list(orders, "task_orders.orders")):
            key = f"task_orders.orders[{i}]"
            if not isinstance(order, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in order):
                self.fail(key, f"expected a list of class indices, got {show(order)}")
            for d in datasets:
                n = DATASETS[d.name].n_classes if d.name in DATASETS else len(order)
                if sorted(order) != list(range(n)):
                    self.fail(key, f"{show(order)} is not a permutation of 0..{n - 1} (dataset {d.name!r})")
            out.append(tuple(order))
        return tuple(out)

    def seeds(self, value):
        seeds = [self.integer(s, f"seeds[{i}]", 0, MAX_SEED) for i, s in enumerate(self.nonempty_list(value, "seeds"))]
        if len(set(seeds)) != len(seeds):
            self.fail("seeds", "a seed is listed twice")
        return tuple(seeds)

    def training(self, value):
        self.mapping(value, "training", TRAINING_KEYS)
        d = TrainingSpec()
        return TrainingSpec(
            optimizer=self.choice(value.get("optimizer", d.optimizer), "training.optimizer", OPTIMIZERS),
            lr=self.number(value.get("lr", d.lr), "training.lr", minimum=1e-12),
            momentum=self.number(value.get("momentum", d.momentum), "training.momentum", 0.0, below=1.0),
            weight_decay=self.number(value.get("weight_decay", d.weight_decay), "training.weight_decay", 0.0),
            epochs=self.integer(value.get("epochs", d.epochs), "training.epochs", 1),
            batch_size=self.integer(value.get("batch_size", d.batch_size), "training.batch_size", 1),
            precision=self.choice(value.get("precision", d.precision), "training.precision", PRECISIONS))

    def evaluation(self, value):
        self.mapping(value, "evaluation", EVALUATION_KEYS)
        return self.integer(value.get("batch_size", 512), "evaluation.batch_size", 1)

    def continual(self, value) -> ContinualSpec | None:
        """`every: K` (optimizer steps of a task between curve points) and `subsample: N` (test rows per
        task, default 100): continual evaluation during training; without `every` it is off."""
        if "every" not in value:
            if "subsample" in value:
                self.fail("evaluation.subsample", "is a setting of continual evaluation, which is off; allowed: "
                                                  "also set evaluation.every (optimizer steps between curve points)")
            return None
        every = self.integer(value["every"], "evaluation.every", 1)
        return ContinualSpec(every, self.integer(value.get("subsample", ContinualSpec.subsample),
                                                 "evaluation.subsample", 1))

    def resources(self, value):
        self.mapping(value, "resources", RESOURCE_KEYS)
        return {k: self.number(v, f"resources.{k}", 0.0) for k, v in value.items()}


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               list: "a list", dict: "a mapping", None: "null"}


def _kinds_of(default):
    """The JSON kinds a hyperparameter with this default accepts (None: any)."""
    if default is None:
        return None
    for kind in (bool, int, float, str, list, dict):
        if isinstance(default, kind):
            return (kind,)
    return None


def _is_kind(value, kind) -> bool:
    if kind is None:
        return value is None
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, kind)


def select(protocol: Protocol, *, datasets=None, methods=None, regimes=None, orders=None) -> Protocol:
    """Restrict a protocol to some datasets/methods/regimes and the first `orders` task orders."""
    def pick(items, wanted, key, flag):
        if not wanted:
            return items
        known = [key(i) for i in items]
        for w in wanted:
            if w not in known:
                raise ProtocolError(f"{flag}: {w!r} is not in protocol {protocol.name!r}; allowed: {', '.join(known)}")
        return tuple(i for i in items if key(i) in wanted)

    new_orders = protocol.task_orders
    if orders is not None:
        if orders < 1 or orders > len(protocol.task_orders):
            raise ProtocolError(f"--orders: {orders} is out of range; allowed: 1..{len(protocol.task_orders)}")
        new_orders = protocol.task_orders[:orders]
    if datasets:  # an npz data set may be named as the protocol file wrote it
        datasets = [protocol.written_names.get(d, d) for d in datasets]
    return dataclasses.replace(
        protocol, datasets=pick(protocol.datasets, datasets, lambda d: d.name, "--datasets"),
        methods=pick(protocol.methods, methods, lambda m: m.display, "--methods"),
        regimes=pick(protocol.regimes, regimes, lambda r: r, "--regimes"), task_orders=new_orders)
