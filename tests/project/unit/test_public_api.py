"""The public API: every name in ``coordinator.__all__`` imports from the package itself,
is the object its defining module has, and importing the package loads none of them."""

import subprocess
import sys

import coordinator


def test_every_public_name_is_importable_from_the_package() -> None:
    for name in coordinator.__all__:
        value = getattr(coordinator, name)
        if name != "__version__":
            module = sys.modules[value.__module__]
            assert getattr(module, name) is value, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        coordinator.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("an unknown name resolved")


def test_importing_the_package_loads_no_engine() -> None:
    code = (
        "import sys, coordinator\n"
        "heavy = [m for m in sys.modules if m.startswith(('coordinator.ops', 'coordinator.engine', 'pydantic'))]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", out
