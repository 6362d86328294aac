"""ViT backbones (harness/run/vit.py): timm's model computed exactly, regimes train exactly their set, LoRA merges,
the prompt API, timm weights through timm's own loading (never the network), the uint8 input stage."""
import copy
import hashlib
from pathlib import Path

import pytest
import timm
import torch
from conftest import make_spec
from torch.nn import functional as F

from harness.api.contract import make_optimizer
from harness.api.subspace import effective_weights, lora_layers, write_effective
from harness.config import pretrain as cfg_pretrain
from harness.config.errors import PretrainError
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.run.models import build_model
from harness.run.regimes import apply_regime, inject_adapters
from harness.run.vit import PromptBlock, load_timm_file

TINY = dict(embed_dim=32, depth=3, num_heads=2, mlp_ratio=2.0, patch_size=2)  # vit-tiny as the vocabulary states
TAG = "vit_tiny_patch16_224.augreg_in21k"  # a real timm tag; its architecture is overridden by TINY


def _timm_tiny(shape=(1, 8, 8), num_classes=0, seed=0):
    """vit-tiny built the independent way: plain timm (its own Block, its own forward), random weights."""
    torch.manual_seed(seed)
    return timm.create_model("vit_tiny_patch16_224", **TINY, img_size=shape[1:], in_chans=shape[0],
                             num_classes=num_classes).eval()


def _timm_features(vit, x):
    return vit.forward_head(vit.forward_features(x), pre_logits=True)


def _save(model, path):
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))  # timm's hub file format
    return path


@pytest.fixture
def no_network(monkeypatch):
    """Every download function timm could reach raises; the list of attempted calls is returned."""
    import huggingface_hub
    import huggingface_hub.file_download as fd
    import timm.models._hub as hub

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("network access in a test")

    for module, name in ((huggingface_hub, "hf_hub_download"), (fd, "hf_hub_download"), (hub, "hf_hub_download"),
                         (huggingface_hub, "snapshot_download"), (torch.hub, "download_url_to_file"),
                         (hub, "download_url_to_file")):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, refuse)
    return calls


@pytest.fixture
def tiny_tag(monkeypatch, tmp_path):
    """A weights folder of its own, and TAG allowed for vit-tiny (the published tags are for ViT-B/16)."""
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(cfg_pretrain.TIMM_WEIGHTS, "vit-tiny", (TAG,))
    monkeypatch.setattr(cfg_pretrain, "TIMM_NAMES", (*cfg_pretrain.TIMM_NAMES, TAG))
    return cfg_pretrain.timm_weights_dir() / TAG / "model.safetensors"


def test_features_equal_timms_own_model_on_the_same_weights(tmp_path, no_network):
    vit = _timm_tiny(num_classes=10)
    state = load_timm_file("vit-tiny", (1, 8, 8), _save(vit, tmp_path / "w.safetensors"))
    net = build_model("vit-tiny", (1, 8, 8), 1, 10).eval()
    net.load_state_dict({**net.state_dict(), **state})
    x = torch.randn(6, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(net.features(x), _timm_features(vit, x), atol=1e-6)
    assert net.block_names == ["embed", "block1", "block2", "block3", "norm", "pool"] and not no_network


def test_clip_tower_is_timms_quickgelu_clip_with_norm_pre(tmp_path):
    torch.manual_seed(1)
    ref = timm.create_model("vit_base_patch16_clip_quickgelu_224", num_classes=0, depth=1).eval()
    vit = timm.create_model("vit_base_patch16_clip_224", num_classes=0, depth=1)
    vit.load_state_dict(ref.state_dict())
    net = build_model("vit-b16-clip", (3, 224, 224), 1, 2).eval()
    net.blocks = torch.nn.ModuleDict({n: b for n, b in net.blocks.items() if n not in
                                      [f"block{i}" for i in range(2, 13)]})  # one block: ref has depth 1
    from harness.run.vit import timm_to_blocks

    net.load_state_dict({**net.state_dict(), **timm_to_blocks(ref.state_dict(), 1)})
    assert isinstance(net.blocks.embed.norm_pre, torch.nn.LayerNorm)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(net.features(x), _timm_features(ref, x), atol=1e-5)


def test_uint8_pixels_equal_the_float_route_and_other_sizes_are_resized():
    torch.manual_seed(0)
    net = build_model("vit-tiny", (3, 8, 8), 1, 2).eval()
    pixels = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    normalised = (pixels.float() / 255 - 0.5) / 0.5  # vit-tiny's mean and std (timm's in21k cfg)
    big = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(net.features(pixels), net.features(normalised))
        resized = F.interpolate(big, size=(8, 8), mode="bilinear", align_corners=False, antialias=True)
        assert torch.equal(net.features(big), net.features(resized))
    assert net.blocks.embed.takes_pixels is True


def _expected(name: str, regime: str) -> bool:
    """Which shared parameter a regime trains, by hand (blocks embed, block1..3, norm)."""
    block = name.split(".")[1]
    if regime == "head":
        return False
    if regime == "last-1":
        return block == "norm"
    if regime == "last-2":
        return block in ("block3", "norm")
    if regime == "full":
        return True
    if regime == "bitfit":
        return name.endswith(".bias")
    if regime == "norm":
        return any(f".{n}." in name for n in ("norm1", "norm2")) or name.startswith("blocks.norm.")
    return any(f".{m}.lora_" in name for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"))  # lora-r1


@pytest.mark.parametrize("regime", ["head", "last-1", "last-2", "full", "bitfit", "norm", "lora-r1"])
def test_a_short_training_changes_exactly_the_trainable_set(regime):
    torch.manual_seed(0)
    net = inject_adapters(build_model("vit-tiny", (1, 8, 8), 1, 4), regime)
    apply_regime(net, regime)
    names = {p: n for n, p in net.named_parameters()}
    expected = {n for n in names.values() if n.startswith("heads.") or _expected(n, regime)}
    optimizer = make_optimizer(TrainingSpec(lr=0.1, momentum=0.9, weight_decay=0.01),
                               (p for p in net.parameters() if p.requires_grad))
    assert {names[p] for group in optimizer.param_groups for p in group["params"]} == expected
    frozen = {n: t.detach().clone() for n, t in [*net.named_parameters(), *net.named_buffers()]
              if n not in expected}
    before = {n: p.detach().clone() for n, p in net.named_parameters() if n in expected}
    net.train()
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 4, (16,))
    for _ in range(3):
        optimizer.zero_grad()
        F.cross_entropy(net(x, 0), y).backward()
        optimizer.step()
    after = dict([*net.named_parameters(), *net.named_buffers()])
    assert [n for n, t in frozen.items() if not torch.equal(after[n], t)] == []
    assert [n for n, t in before.items() if torch.equal(after[n], t)] == []  # every trainable one moved
    if regime == "lora-r1":
        assert not any("patch_embed" in n for n in lora_layers(net)) and len(lora_layers(net)) == 12


def test_lora_merged_equals_unmerged_on_a_vit():
    torch.manual_seed(0)
    net = inject_adapters(build_model("vit-tiny", (1, 8, 8), 1, 4), "lora-r1")
    apply_regime(net, "lora-r1")
    with torch.no_grad():
        for layer in lora_layers(net).values():
            layer.lora_B["default"].weight.normal_()
    merged = copy.deepcopy(net)
    write_effective(merged, effective_weights(net))
    assert all(float(layer.lora_B["default"].weight.detach().abs().sum()) == 0 for layer in lora_layers(merged).values())
    x = torch.randn(8, 1, 8, 8)
    with torch.no_grad():
        unmerged, done = net.eval()(x, 0), merged.eval()(x, 0)
    assert not torch.allclose(unmerged, build_model("vit-tiny", (1, 8, 8), 1, 4).eval()(x, 0))
    assert torch.allclose(unmerged, done, atol=1e-5)


def _block():
    torch.manual_seed(0)
    return build_model("vit-tiny", (1, 8, 8), 1, 2).blocks.block2.eval()


def test_a_block_without_prompt_is_timms_block_bitwise():
    from timm.models.vision_transformer import Block

    block = _block()
    plain = Block(32, 2, mlp_ratio=2.0, qkv_bias=True).eval()
    plain.load_state_dict(block.state_dict())
    x = torch.randn(3, 17, 32)
    assert isinstance(block, PromptBlock) and isinstance(block, Block) and block.prompt is None
    assert torch.equal(block(x), plain(x))


def test_add_prompt_changes_nothing_else_and_is_vpt_initialised():
    block = _block()
    before = {n: t.clone() for n, t in [*block.named_parameters(), *block.named_buffers()]}
    block.add_prompt(5, replace=False)
    after = dict([*block.named_parameters(), *block.named_buffers()])
    assert set(after) - set(before) == {"prompt"} and all(torch.equal(after[n], t) for n, t in before.items())
    bound = (6 / (3 * 2 * 2 + 32)) ** 0.5  # VPT: patch area 2x2, width 32
    assert block.prompt.shape == (5, 32) and float(block.prompt.detach().abs().max()) <= bound
    assert block.embed_dim == 32 and block.prefix_tokens == 1


@pytest.mark.parametrize("replace", [False, True])
def test_prompt_tokens_go_after_the_class_token(replace):
    block = _block()
    block.add_prompt(3, replace=replace)
    seen = []
    block.norm1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    x = torch.randn(2, 17, 32)
    out = block(x)
    sequence = seen[0]
    assert torch.equal(sequence[:, :1], x[:, :1])
    assert torch.equal(sequence[:, 1:4], block.prompt.expand(2, -1, -1))
    assert torch.equal(sequence[:, 4:], x[:, 4:] if replace else x[:, 1:])
    assert out.shape == (2, 17 if replace else 20, 32)


def test_harness_made_weights_load_through_the_download_path_never_the_network(tiny_tag, no_network, tmp_path):
    from harness.run.pretrain import load_backbone, pretrained_backbone

    vit = _timm_tiny(num_classes=10, seed=3)
    _save(vit, tiny_tag)
    value = cfg_pretrain.parse_pretrain({"timm": TAG}, "p.yaml", tmp_path)
    assert value.sha256 == hashlib.sha256(tiny_tag.read_bytes()).hexdigest() and not value.missing
    assert value.as_json() == {"timm": TAG, "sha256": value.sha256}  # name and content hash: in the run id
    spec = make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), pretrain=value)
    state, weights = pretrained_backbone(spec, (1, 8, 8))
    assert (weights.sha256, weights.path) == (value.sha256, str(tiny_tag))
    net = build_model("vit-tiny", (1, 8, 8), 1, 10).eval()
    load_backbone(net, state, value.label)
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(net.features(x), _timm_features(vit, x), atol=1e-6)
    assert no_network == []


def test_missing_and_damaged_weights_are_one_line(tiny_tag, no_network, tmp_path):
    from harness.run.pretrain import pretrained_backbone, with_timm_weights

    missing = cfg_pretrain.parse_pretrain({"timm": TAG}, "p.yaml", tmp_path)
    assert missing.missing and missing.label.endswith("(missing)")
    assert with_timm_weights(missing, download=False) == missing
    spec = make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), pretrain=missing)
    with pytest.raises(PretrainError, match="--download") as caught:
        pretrained_backbone(spec, (1, 8, 8))
    assert "\n" not in str(caught.value)
    tiny_tag.parent.mkdir(parents=True)
    tiny_tag.write_bytes(b"not a safetensors file")
    damaged = with_timm_weights(missing, download=False)
    with pytest.raises(PretrainError, match="timm cannot load") as caught:
        pretrained_backbone(make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), pretrain=damaged), (1, 8, 8))
    assert "\n" not in str(caught.value) and no_network == []


def test_a_vit_run_with_timm_weights_through_the_engine(tiny_tag, no_network):
    from harness.config.pretrain import Pretrain, PretrainKind
    from harness.run.engine import run_one

    _save(_timm_tiny(num_classes=10, seed=3), tiny_tag)
    value = Pretrain(PretrainKind.TIMM, weights=TAG).with_weights_hash()
    spec = make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), pretrain=value, regime="lora-r1",
                     scenario="class-il", training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=64))
    record = run_one(spec, device="cpu")
    assert record.status == "ok", record.error
    assert record.provenance["pretrained"]["sha256"] == value.sha256 and no_network == []


def test_download_goes_through_timm_into_the_weights_folder(tiny_tag, monkeypatch, tmp_path):
    from harness.run import pretrain as run_pretrain

    made = _timm_tiny(num_classes=10, seed=5)
    asked = []

    def fake_create_model(tag, pretrained=False, cache_dir=None, **kwargs):  # timm's hub cache layout
        asked.append((tag, pretrained))
        _save(made, Path(cache_dir) / "models--timm--x" / "snapshots" / "abc" / "model.safetensors")
        return made

    monkeypatch.setattr(timm, "create_model", fake_create_model)
    missing = cfg_pretrain.parse_pretrain({"timm": TAG}, "p.yaml", tmp_path)
    found = run_pretrain.with_timm_weights(missing, download=True)
    assert asked == [(TAG, True)] and tiny_tag.is_file()
    assert found.sha256 == hashlib.sha256(tiny_tag.read_bytes()).hexdigest()
    assert [p.name for p in tiny_tag.parent.parent.iterdir()] == [TAG]  # no temporary folder left


def test_checkpoint_and_dataset_pretraining_work_for_a_vit(tmp_path, monkeypatch):
    from harness.run.pretrain import pretrained_backbone

    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(2)
    saved = build_model("vit-tiny", (1, 8, 8), 1, 10)
    torch.save(saved.state_dict(), tmp_path / "vit.pt")
    value = cfg_pretrain.parse_pretrain({"checkpoint": "vit.pt"}, "p.yaml", tmp_path)
    state, _ = pretrained_backbone(make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), pretrain=value),
                                   (1, 8, 8))
    assert all(torch.equal(state[k], v) for k, v in saved.state_dict().items() if k.startswith("blocks."))
    recipe = {"dataset": "same", "holdout": 0.1, "epochs": 1, "lr": 0.05, "batch_size": 64, "seed": 0}
    value = cfg_pretrain.parse_pretrain(recipe, "p.yaml", tmp_path).for_dataset("digits")
    state, weights = pretrained_backbone(make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), pretrain=value),
                                         (1, 8, 8))
    assert weights.source == "dataset" and set(state) == {k for k in saved.state_dict() if
                                                                   k.startswith("blocks.")}
    assert not torch.equal(state["blocks.block1.attn.qkv.weight"], saved.state_dict()["blocks.block1.attn.qkv.weight"])


def test_frozen_transformer_blocks_are_cached_and_attention_flops_counted():
    from harness.run.compute import flops_per_sample
    from harness.run.prefix_cache import frozen_prefix, prefix_features

    net = build_model("vit-tiny", (1, 8, 8), 1, 4)
    apply_regime(net, "last-2")
    assert frozen_prefix(net) == ["embed", "block1", "block2"]
    apply_regime(net, "head")
    assert frozen_prefix(net) == net.block_names
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(prefix_features(net, frozen_prefix(net), x), net.eval().features(x))
    tokens, width, hidden, patches = 17, 32, 64, 16  # by hand: per block qkv, q@k, attn@v, proj, fc1, fc2
    block = 2 * tokens * width * 3 * width + 2 * 2 * tokens * tokens * width + 2 * tokens * width * width \
        + 2 * 2 * tokens * width * hidden
    assert flops_per_sample(net, (1, 8, 8))["blocks"] == [2 * patches * 4 * width, block, block, block, 0, 0]


def test_a_protocol_without_its_timm_weights_plans_and_a_run_stops_with_one_line(cli, monkeypatch, tmp_path,
                                                                                no_network):
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    protocol = tmp_path / "p.yaml"
    protocol.write_text("name: vit-p\nversion: '1'\nscenario: class-il\n"
                        "pretrain: {timm: vit_base_patch16_224.augreg_in21k}\n"
                        "datasets: [{name: digits, n_tasks: 5, classes_per_task: 2, model: vit-b16}]\n"
                        "regimes: [head]\nmethods: [naive]\n")
    results = tmp_path / "results"
    code, out, err = cli("run", "--protocol", protocol, "--results", results, "--no-mlflow", "--dry-run")
    assert code == 0 and "weights missing: pretrain.timm vit_base_patch16_224.augreg_in21k" in out
    assert "--download" in out
    code, out, err = cli("run", "--protocol", protocol, "--results", results, "--no-mlflow")
    assert code == 2 and err.count("\n") == 1 and "--download" in err and "Traceback" not in err
    assert no_network == []
