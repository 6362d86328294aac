"""What `analyse(records)` returns: every leaderboard table, by name, in one frozen value.

Each field is always there (a table with no rows when nothing applies), so a consumer reads
`result.bayes`, never asks whether a table exists. The scenario (task-IL, class-IL) is part of every
key: each table has a `scenario` column, and rankings and comparisons are made within one scenario.
Rank statistics leave flagged runs and degenerate regimes out (see tables.analyse); the metric
tables count every run.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import pandas as pd


@dataclass(frozen=True)
class AnalysisSettings:
    """The settings the tables were computed with (the pages and the paper tables quote them)."""

    rope_points: float  # region of practical equivalence of the Bayesian comparisons, in ACC points
    rope: float  # the same on the scale accuracies are stored in (a fraction, or points)
    credible: float  # posterior probability a Bayesian decision needs
    alpha: float  # level of the frequentist tests
    include_flagged: bool  # flagged runs entered the rank statistics


@dataclass(frozen=True)
class AnalysisResult:
    """The tables of one set of records; each a DataFrame, keyed as its comment says."""

    runs: pd.DataFrame  # one row per record: the tidy frame every other table comes from (frame.py)
    coverage: pd.DataFrame  # (dataset, regime, method): runs expected, ok, not ok, flagged (coverage.py)
    methods: pd.DataFrame  # (dataset, regime, method): counts, budget, mean + CI of each metric, mean rank
    order_ranks: pd.DataFrame  # (dataset, regime, order, method): ACC and its rank in that task order
    global_ranks: pd.DataFrame  # (regime, method): mean rank over every (dataset, order) block, pooled
    tau: pd.DataFrame  # (dataset, regime_a, regime_b): Kendall tau_b between the regimes' rankings
    w_regimes: pd.DataFrame  # per dataset: Kendall's W across all regimes
    regimes: pd.DataFrame  # (dataset, regime): family, trainable fraction and parameter counts
    family_tau: pd.DataFrame  # each regime pair once, labelled within / across families
    families: pd.DataFrame  # (dataset or "(all)", kind): mean tau within vs across families
    family_w: pd.DataFrame  # (dataset, family): Kendall's W of one family's regimes
    absent: pd.DataFrame  # (dataset, method): families a method is not run in, by design
    w_orders: pd.DataFrame  # (dataset, regime): Kendall's W across task orders (order sensitivity)
    reversals: pd.DataFrame  # method pairs whose mean-ACC order flips between two regimes
    reversal_summary: pd.DataFrame  # (dataset, regime_a, regime_b): pairs compared, flips, significant
    friedman: pd.DataFrame  # (dataset, regime): Friedman / Iman-Davenport tests and critical difference
    nemenyi: pd.DataFrame  # (dataset, regime, method pair): Nemenyi p
    bayes: pd.DataFrame  # (dataset or "(all)", regime, method pair): Bayesian signed-rank probabilities
    credible_reversals: pd.DataFrame  # pairs credibly ordered one way in one regime, the other in another
    degenerate: pd.DataFrame  # (dataset, regime): whether every method ties there, and why
    power: pd.DataFrame  # (dataset, regime, test): what the test can reach with the blocks it has
    curves: pd.DataFrame  # (dataset, regime, method, task): mean accuracy on the tasks seen so far
    norm_forgetting: pd.DataFrame  # (dataset, regime): update norm vs forgetting correlations
    norm_forgetting_family: pd.DataFrame  # (dataset, family): the same pooled over a family's regimes
    depth_profile: pd.DataFrame  # (dataset, regime): norm and forgetting against the trainable fraction
    depth_trend: pd.DataFrame  # (dataset, quantity): Spearman rho with the regime's size rank
    step_level: pd.DataFrame  # (dataset, regime): per-task update norm vs per-task forgetting
    # (dataset, regime) of class-IL records: tau between the task-aware and the class-IL ranking of the
    # same runs, beside the tau between this regime and the others (class-IL rankings)
    scenario_tau: pd.DataFrame
    # any-time evaluation (runs with a continual-evaluation curve; anytime.py): no rows without one.
    # (dataset, regime, method, task, point): mean old/seen/first-task accuracy with CIs around task boundaries
    anytime_curves: pd.DataFrame
    anytime_ranks: pd.DataFrame  # (dataset, regime, method): ACC, min-ACC, WC-ACC, A_AUC and their mean ranks
    anytime_tau: pd.DataFrame  # (dataset, regime): tau_b between the ACC ranking and each any-time ranking
    gap_trend: pd.DataFrame  # (dataset, method): stability-gap depth vs trainable fraction and update norm
    budget: pd.DataFrame  # per method: mean steps, samples and memory kept, steps relative to the median method
    flagged: pd.DataFrame  # one row per flagged record: where it ran and its warnings
    settings: AnalysisSettings

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by its field name, in field order (settings is not a table)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "settings"}

    def of_dataset(self, dataset: str, scenario: str | None = None) -> AnalysisResult:
        """The tables cut to one data set's rows (of one scenario, when given); those pooled over data
        sets (no dataset column: global_ranks, budget) stay whole, or are cut to the scenario."""
        cut = self.of_scenario(scenario) if scenario is not None else self
        return replace(cut, **{name: df[df["dataset"] == dataset] for name, df in cut.tables().items()
                               if "dataset" in df.columns})

    def of_scenario(self, scenario: str) -> AnalysisResult:
        """The tables cut to one scenario's rows."""
        return replace(self, **{name: df[df["scenario"] == scenario] for name, df in self.tables().items()
                                if "scenario" in df.columns})
