"""`ranpac` (harness/methods/ranpac.py) against RanPAC's official code (tests/official/ranpac_ranpac.py) on identical
tensors: the features a run's feature pass gave are fed, in the same order, to the official replace_fc; the
chosen λ, the ridge weights W_o after every task and the logits are compared. Determinism, budget, state."""
import pytest
import torch
from conftest import make_spec
from official import ranpac_ranpac as official

from harness.config.specs import DatasetSpec, TrainingSpec
from harness.methods import ranpac
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.streams import split_tasks

N_TASKS, CPT = 5, 2
ORDER = (3, 1, 4, 0, 5, 9, 2, 6, 8, 7)


def spec(m, regime="head", epochs=1):
    return make_spec(method="ranpac", regime=regime, scenario="class-il", pretrain="none", class_order=ORDER,
                     hparams={"M": m}, dataset=DatasetSpec("digits", N_TASKS, CPT, "vit-tiny"),
                     training=TrainingSpec(lr=0.01, momentum=0.9, epochs=epochs, batch_size=32))


def spied_run(monkeypatch, run_spec):
    """The record, the strategy, and per task: the (features, labels) the classifier learnt from and W_o after."""
    seen = {"inputs": [], "w_out": [], "states": []}
    learn = ranpac.RidgeClassifier.learn

    def spy(self, features, labels):
        seen["inputs"].append((features.clone(), labels.clone()))
        learn(self, features, labels)
        seen["w_out"].append(self.w_out.clone())

    def observer(event, t, strategy):
        if event == "after_task":
            seen["strategy"] = strategy
            seen["states"].append({k: v.clone() for k, v in strategy.harness_state().items()})

    monkeypatch.setattr(ranpac.RidgeClassifier, "learn", spy)
    record = run_one(run_spec, device="cpu", observer=observer)
    assert record.status == "ok", record.error
    return record, seen


class Features(torch.nn.Module):
    def __init__(self, model, width):
        super().__init__()
        object.__setattr__(self, "model", model)
        self.out_dim = width

    def forward(self, x):
        return x if self.model is None else self.model.features(x)


def official_run(inputs, m, w_rand, width):
    """The official class-incremental RP loop on the recorded features (its convnet passes them through)."""
    learner = official.Learner({"convnet": Features(None, width), "total_classnum": N_TASKS * CPT, "use_RP": True,
                                "M": m})
    w_out = []
    for t, (features, labels) in enumerate(inputs):
        learner.new_task_fc((t + 1) * CPT)
        if t == 0:
            learner.setup_RP(w_rand)
        learner.replace_fc([(None, features, labels)])
        w_out.append(learner._network.fc.weight.data.clone())
    return learner, w_out


@pytest.mark.parametrize("m", [300, 0])
def test_lambda_ridge_weights_and_logits_equal_the_official_code(monkeypatch, m):
    record, seen = spied_run(monkeypatch, spec(m))
    strategy = seen["strategy"]
    classifier = strategy.classifier
    width = seen["inputs"][0][0].shape[1]
    w_rand = classifier.w_rand if m > 0 else None
    if m > 0:  # the seeded draw: N(0, 1), (d, M), from the run's seed
        assert torch.equal(w_rand, ranpac.random_projection(width, m, 0))
    learner, theirs = official_run(seen["inputs"], m, w_rand, width)
    assert [float(r) for r in learner.chosen_ridges] == classifier.lambdas == record.diagnostics["ranpac_lambda"]
    w_diffs = []
    for t, (ours, official_w) in enumerate(zip(seen["w_out"], theirs)):
        rows = (t + 1) * CPT
        assert official_w.shape == ours[:rows].shape
        assert torch.all(ours[rows:] == 0)  # classes not seen yet: no target, a zero row (masked at -inf)
        w_diffs.append(float((ours[:rows] - official_w).abs().max()))
    # logits on every task's test data, through the run's features: the harness's evaluated model vs the official
    tasks = split_tasks(load_dataset("digits"), ORDER, N_TASKS, CPT, "class-il")
    x = torch.cat([t.x_test for t in tasks])
    model = strategy.model.eval()
    learner._network.convnet = Features(model, width)
    with torch.no_grad():
        ours, official_logits = strategy.harness_eval_model().eval()(x), learner._network.eval()(x)["logits"]
    logit_diff = float((ours - official_logits).abs().max())
    scale = float(official_logits.abs().max())
    print(f"ranpac M={m}: λ {classifier.lambdas}; W_o max abs diff per task {w_diffs}; logits max abs diff "
          f"{logit_diff:.3g} (largest logit {scale:.3g})")
    assert max(w_diffs) <= 1e-4 * float(torch.cat(theirs).abs().max()) and logit_diff <= 1e-4 * scale


def test_choose_ridge_by_hand_on_a_separable_problem():
    """An independent route: λ by the official rule re-done with numpy in float64 on a small problem."""
    import numpy as np

    g = torch.Generator().manual_seed(1)
    h = torch.randn(50, 6, generator=g)
    y = ranpac.one_hot(torch.randint(0, 3, (50,), generator=g), 3)
    hn, yn = h.double().numpy(), y.double().numpy()
    fit, val = hn[:40], hn[40:]
    losses = [np.mean((val @ np.linalg.solve(fit.T @ fit + r * np.eye(6), fit.T @ yn[:40]) - yn[40:]) ** 2)
              for r in ranpac.RIDGES]
    assert ranpac.choose_ridge(h, y) == float(ranpac.RIDGES[int(np.argmin(losses))])


def test_runs_are_deterministic_forward_only_and_w_o_is_the_state(monkeypatch):
    a, seen = spied_run(monkeypatch, spec(64))
    b = run_one(spec(64), device="cpu")
    assert a.acc_matrix == b.acc_matrix and a.budget == b.budget and a.diagnostics == b.diagnostics
    assert a.budget["optimizer_steps"] == 0 and a.budget["compute"]["backward_samples"] == 0
    states = [s["prototypes.ridge"] for s in seen["states"]]
    assert [s.shape for s in states] == [(CPT * (t + 1), 64) for t in range(N_TASKS)]
    assert not torch.equal(states[1][:CPT], states[0])  # W_o of old classes moves as G and Q grow (unlike prototypes)
