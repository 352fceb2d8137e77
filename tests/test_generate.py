"""pagedkv.generate (`npm run generate`) refuses bad arguments before it starts a browser."""
import pytest

from pagedkv import generate


def test_an_unreadable_messages_file_is_one_error_line_and_exit_2(tmp_path, capsys):
    missing = str(tmp_path / "missing.json")
    assert generate.main(["--messages-json", missing]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot read messages from {missing}: ")


def test_greedy_and_a_temperature_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        generate.main(["--messages-json", str(tmp_path / "chat.json"), "--greedy", "--temperature", "0.5"])
    assert exc.value.code == 2
    assert "--greedy and --temperature exclude each other" in capsys.readouterr().err
