"""`python -m kube_standin`: documented options, one-line errors for bad values.

(The fixtures start it as a subprocess; these check its option handling in-process, which is cheaper.)"""

from __future__ import annotations

from kube_standin.__main__ import kube_stand_in_app
from typer.testing import CliRunner


def test_help_documents_every_option_with_its_environment_variable() -> None:
    result = CliRunner().invoke(kube_stand_in_app(), ["--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    for option in ("--port", "--kubeconfig", "--token", "--history-size", "--max-grace-seconds"):
        assert option in result.output
    assert "KERAUNOS_KUBE_HISTORY_SIZE" in result.output


def test_a_bad_value_is_one_line_naming_the_flag() -> None:
    result = CliRunner().invoke(kube_stand_in_app(), ["--history-size", "0"])

    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "--history-size" in result.output
