"""harness.compat silences the stack's known warnings by message, and nothing else."""
import warnings

import pytest

from harness import compat

KNOWN = [
    (DeprecationWarning, "__array_wrap__ must accept context and return_scalar arguments (positionally) in the "
                         "future. (Deprecated NumPy 2.0)"),
    (DeprecationWarning, "JAXopt is no longer maintained. See https://docs.jax.dev/en/latest/ for alternatives."),
    (DeprecationWarning, "Call to deprecated function f (removal in version 0.7: switch to g)"),
    (DeprecationWarning, "Call to deprecated class C (removal in version 0.7: switch to D)"),
    (DeprecationWarning, "The ``noload`` loader strategy is deprecated and will be removed in a future release."),
    (UserWarning, "No loggers specified, metrics will not be logged"),
    (UserWarning, "TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the only "
                  "storage class."),
]
OTHERS = [
    (FutureWarning, "The default of observed=False is deprecated and will be changed to True"),
    (FutureWarning, "anything at all"),
    (DeprecationWarning, "this function is deprecated, use that one"),
    (DeprecationWarning, "JAXopt-like text later in a message: JAXopt is no longer maintained"),
    (UserWarning, "No loggers specified for this other thing"),
]


def _shown(category, message) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compat.silence_known_warnings()
        warnings.warn(message, category, stacklevel=1)
    return bool(caught)


@pytest.mark.parametrize("category, message", KNOWN)
def test_known_warnings_are_silenced(category, message):
    assert not _shown(category, message)


@pytest.mark.parametrize("category, message", OTHERS)
def test_other_warnings_are_shown(category, message):
    assert _shown(category, message)
