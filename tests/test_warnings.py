"""The suite's warning policy (pyproject.toml): a warning raised in graphkit's own code fails the
test that raised it, so a user never meets a warning the suite let through; the libraries'
deprecation notes about their own internals stay quiet."""

import warnings

import pytest


def _warn_from(module: str, category: type[Warning]) -> None:
    exec(f"import warnings; warnings.warn('from {module}', {category.__name__})", {"__name__": module})


@pytest.mark.parametrize("category", [UserWarning, RuntimeWarning, DeprecationWarning])
def test_a_warning_raised_in_graphkit_fails_the_test(category):
    with pytest.raises(category, match="graphkit.ghn.example"):
        _warn_from("graphkit.ghn.example", category)


@pytest.mark.parametrize(
    "module", ["torch.fx.example", "transformers.example", "timm.example", "torch_geometric.example"]
)
def test_the_libraries_deprecation_notes_stay_quiet(module):
    with warnings.catch_warnings(record=True) as caught:
        _warn_from(module, DeprecationWarning)
    assert not caught
