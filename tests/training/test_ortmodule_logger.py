"""ORTMODULE_LOG_LEVEL as an environment variable and the rank-0 filtering of ORTModule's logger,
against ORT 1.19.2's own options and logger (one 2-rank launch)."""
import pytest

from ortlab.errors import OrtlabError
from ortlab.ortmodule import logger as lg

pytest.importorskip("onnxruntime.training")


@pytest.fixture(scope="module")
def table():
    """env_level_table's rows by (DebugOptions level, env value)."""
    found = lg.env_level_table()
    return {(row[0], row[1]): dict(zip(found.header, row)) for row in found.rows}


@pytest.fixture(scope="module")
def ranks():
    """One launch: rank_log_counts at WARNING on 2 gloo ranks (INFO is shown in the notebook)."""
    from ortlab.distributed import launch

    return launch(lg.rank_log_counts, world_size=2, args=(("WARNING",),), timeout=180)


def _ort_logging_level(options_level, env):
    """The level ORT's own DebugOptions settles on with ORTMODULE_LOG_LEVEL=env."""
    from onnxruntime.training.ortmodule import DebugOptions, LogLevel

    with lg.log_level_env(env):
        options = DebugOptions(log_level=LogLevel[options_level])
    return options.log_level.name, options.logging.log_level.name


def test_env_raises_the_level(table):
    assert table[("WARNING", "(unset)")]["ORTModule INFO"] == 0
    assert table[("WARNING", "INFO")]["ORTModule INFO"] > 0
    assert table[("WARNING", "DEVINFO")]["ORT C++ INFO"] > 0 and table[("WARNING", "INFO")]["ORT C++ INFO"] == 0


def test_env_overrides_only_logging_log_level(table):
    for options_level, env in (("WARNING", "INFO"), ("INFO", "WARNING")):
        row = table[(options_level, env)]
        expected = _ort_logging_level(options_level, env)
        assert (row["debug_options.log_level"], row["debug_options.logging.log_level"]) == expected
        assert expected == (options_level, env)


def test_partial_override_leaves_the_exporter_graph(table):
    quiet, loud = table[("INFO", "WARNING")], table[("INFO", "(unset)")]
    assert quiet["ORTModule INFO"] == 0 and quiet["exporter graph"] > 0 and loud["exporter graph"] > 0
    assert table[("WARNING", "INFO")]["exporter graph"] == 0


def test_lowercase_value_is_a_key_error(table):
    assert table[("WARNING", "info")]["error"] == "KeyError: 'info'"
    with pytest.raises(KeyError):
        _ort_logging_level("WARNING", "info")


def test_rank_zero_filtering_at_warning(ranks):
    zero, one = ranks[0]["WARNING"], ranks[1]["WARNING"]
    assert zero["ORTModule WARNING"] >= 1 and zero["logger names"] == ["orttraining.rank-0"]
    assert one["lines"] == 0


def test_rank_filter_table(ranks):
    rows = lg.rank_filter_table(ranks).rows
    assert [(r[0], r[1]) for r in rows] == [("WARNING", 0), ("WARNING", 1)]


def test_env_is_restored():
    import os

    before = os.environ.get(lg.ENV)
    with lg.log_level_env("INFO"):
        assert os.environ[lg.ENV] == "INFO"
    assert os.environ.get(lg.ENV) == before


@pytest.mark.parametrize("call", [
    lambda: lg.one_step("info"), lambda: lg.env_level_table([("WARNING",)]),
    lambda: lg.rank_filter_table("x"), lambda: lg.log_level_env(5).__enter__(),
    lambda: lg.one_step("WARNING", None, module=42), lambda: lg.rank_log_counts(0, 1, ("nope",)),
])
def test_bad_input_is_explained(call):
    with pytest.raises(OrtlabError):
        call()


def test_portable_table_hides_only_the_cpp_line_counts(table):
    """portable=True: C++ INFO as yes/no and the other lines counted; DEVINFO adds only C++ lines to INFO."""
    found = lg.env_level_table([("WARNING", "DEVINFO"), ("WARNING", None)], portable=True)
    rows = {row[1]: dict(zip(found.header, row)) for row in found.rows}
    assert "lines (C++ INFO aside)" in found.header
    assert rows["DEVINFO"]["ORT C++ INFO"] == "yes" and rows["(unset)"]["ORT C++ INFO"] == "no"
    assert rows["DEVINFO"]["lines (C++ INFO aside)"] == table[("WARNING", "INFO")]["lines"]
    assert rows["(unset)"]["lines (C++ INFO aside)"] == table[("WARNING", "(unset)")]["lines"]
    with pytest.raises(OrtlabError, match="portable"):
        lg.env_level_table(portable="yes")
