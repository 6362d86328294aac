"""Where the site's templates and static files live, and the jinja2 environment that renders them.

The style sheet and script (leaderboard/static/) are inlined into every page at build time, not
linked: each page stays one self-contained file that opens from file://, can be copied or mailed
alone, and the writer owns no extra files. Regime tag colours are per build (they depend on which
regimes the records have), so their `.rg-<slug>` rules are written after the style sheet.
"""
from __future__ import annotations

import re

import jinja2
from markupsafe import Markup

from ...config.metrics import ANYTIME, METRICS
from ...config.resources import static_dir, templates_dir
from ...config.vocabulary import Scenario, Status
from ..formatting import half_width, slug
from .filters import FILTERS

TEMPLATES = templates_dir()
STATIC = static_dir()
_COLOUR = re.compile(r"#[0-9a-fA-F]{3,8}")


def environment() -> jinja2.Environment:
    """Autoescaping, strict (an undefined name is an error) environment with the site's filters."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(FILTERS)
    env.globals["metrics"] = METRICS  # labels and directions of the metric table
    env.globals["anytime_metrics"] = ANYTIME  # the same for the any-time metrics (continual evaluation)
    env.globals.update(Status=Status, Scenario=Scenario)  # templates decide by the vocabulary, not by strings
    env.globals["half_width"] = half_width  # the "± half" of a CI, as the report computes it
    return env


def regime_css(colours: dict[str, str]) -> str:
    """One `.rg-<slug>` rule per regime giving its tag its colour (class names, not inline styles)."""
    bad = [c for c in colours.values() if not _COLOUR.fullmatch(c)]
    if bad:  # the value goes into a <style> block: only a hex colour may
        raise ValueError(f"regime colour {bad[0]!r} is not a hex colour")
    return "".join(f".rg-{slug(r)} {{ background:{c}; }}\n" for r, c in colours.items())


def assets(colours: dict[str, str]) -> dict[str, Markup]:
    """The page's CSS (style sheet + regime colours) and script, as markup for base.html."""
    css = (STATIC / "site.css").read_text(encoding="utf-8") + regime_css(colours)
    return {"css": Markup(css), "js": Markup((STATIC / "site.js").read_text(encoding="utf-8"))}
