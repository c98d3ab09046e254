"""lakesink refuses, at import, a PySpark minor its CI does not test, naming what it found."""

from __future__ import annotations

import pytest

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.spark_version import UnsupportedSparkError, check_pyspark, pyspark_version


@pytest.mark.parametrize("found", ["4.1.4", "4.2.1", "3.5.9", "4.4.0"])
def test_an_untested_pyspark_is_refused_naming_it_and_what_to_install(found: str) -> None:
    with pytest.raises(UnsupportedSparkError, match=rf"this Python has PySpark {found}\. .*pip install 'pyspark>=4\.3,<4\.4'") as refused:
        check_pyspark(found)
    assert isinstance(refused.value, LakesinkError) and isinstance(refused.value, ImportError)


def test_the_installed_pyspark_is_supported() -> None:
    assert pyspark_version().startswith("4.3.")
    check_pyspark()  # the package imported, so this passes; it must keep passing on the same string
    check_pyspark("4.3.0")
