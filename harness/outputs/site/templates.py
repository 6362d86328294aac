"""Where the site's templates live, and the jinja2 environment that renders them."""
from __future__ import annotations

import jinja2

from ...config.paths import REPOSITORY
from .filters import FILTERS

TEMPLATES = REPOSITORY / "leaderboard" / "templates"


def environment() -> jinja2.Environment:
    """Autoescaping, strict (an undefined name is an error) environment with the site's filters."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(FILTERS)
    return env
