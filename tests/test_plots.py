"""glassllm.plots and `glassllm plot`: history files -> a loss/lr PNG."""
import math

import pytest

from glassllm.cli import main
from glassllm.plots import find_history, plot_history, read_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

CSV = """step,train_loss,val_loss,lr,tokens_per_s
0,5.6,5.5,0.0001,100
1,5.1,,0.0002,110
2,4.7,,0.0003,
3,4.2,4.3,0.0003,120
bad,1,1,1,1
"""


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    # IHDR: width and height of the 8x6 inch, 100 dpi figure.
    assert int.from_bytes(data[16:20], "big") == 800 and int.from_bytes(data[20:24], "big") == 600


def test_read_history_csv_tolerates_empty_cells_and_extra_columns(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text(CSV)
    h = read_history(path)
    assert h["step"] == [0, 1, 2, 3]  # the row without a numeric step is skipped
    assert h["train_loss"] == [5.6, 5.1, 4.7, 4.2]
    assert h["val_loss"][0] == 5.5 and math.isnan(h["val_loss"][1]) and h["val_loss"][3] == 4.3
    assert h["lr"] == [0.0001, 0.0002, 0.0003, 0.0003]


def test_read_history_jsonl_and_train_history_dicts(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"step": 0, "loss": 3.0, "lr": 0.1, "val_loss": 3.1}\n\n'
                    '{"step": 1, "loss": 2.0, "lr": 0.2}\n')
    h = read_history(path)
    assert h["train_loss"] == [3.0, 2.0] and h["lr"] == [0.1, 0.2]
    assert h["val_loss"][0] == 3.1 and math.isnan(h["val_loss"][1])
    path.write_text('{"step": 0}\n{oops\n')
    with pytest.raises(ValueError, match="history.jsonl:2"):
        read_history(path)
    (tmp_path / "empty.csv").write_text("step,loss\n")
    with pytest.raises(ValueError, match="no rows"):
        read_history(tmp_path / "empty.csv")


def test_plot_history_writes_a_png_atomically(tmp_path):
    out = tmp_path / "curve.png"
    history = [{"step": s, "loss": 5.0 / (s + 1), "lr": 0.001 * min(1, s / 3)} for s in range(20)]
    for s in (0, 10, 19):
        history[s]["val_loss"] = 5.2 / (s + 1)
    assert plot_history(history, out) == str(out)
    assert_png(out)
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]  # no temp file left
    with pytest.raises(ValueError, match="no rows"):
        plot_history([], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_cli_plot_reads_run_dir_and_writes_loss_png(tmp_path, capsys):
    (tmp_path / "history.csv").write_text(CSV)
    assert find_history(tmp_path) == str(tmp_path / "history.csv")
    assert main(["plot", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "loss.png")
    assert_png(tmp_path / "loss.png")
    empty = tmp_path / "empty_run"
    empty.mkdir()
    assert main(["plot", str(empty)]) == 2
    assert "no history.csv or history.jsonl" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "run directory not found" in capsys.readouterr().err


def write_csv(tmp_path):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "history.csv").write_text(CSV)
    return run


@pytest.mark.parametrize("suffix,magic", [(".svg", b"<?xml"), (".pdf", b"%PDF"),
                                          (".PNG", PNG_SIGNATURE), ("", PNG_SIGNATURE)])
def test_image_format_follows_the_suffix(tmp_path, suffix, magic):
    run = write_csv(tmp_path)
    out = tmp_path / f"curves{suffix}"
    assert plot_history(run / "history.csv", out) == str(out)
    assert out.read_bytes().startswith(magic)
    if suffix == ".svg":
        assert b"<svg" in out.read_bytes()[:1000]


def test_unknown_image_suffix_is_refused_before_writing(tmp_path, capsys):
    run = write_csv(tmp_path)
    with pytest.raises(ValueError, match=r"curves\.xyz: cannot write \.xyz.*\.svg"):
        plot_history(run / "history.csv", tmp_path / "curves.xyz")
    assert not (tmp_path / "curves.xyz").exists()


def test_binary_history_error_names_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.csv").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=f"{run / 'history.csv'}: not a UTF-8"):
        read_history(run / "history.csv")
    assert main(["plot", str(run)]) == 2
    assert "history.csv: not a UTF-8" in capsys.readouterr().err
    assert not (run / "loss.png").exists()


@pytest.mark.parametrize("where", ["missing_dir/loss.png", "a_directory"])
def test_write_errors_name_the_users_path_not_a_temporary(tmp_path, capsys, where):
    run = write_csv(tmp_path)
    (tmp_path / "a_directory").mkdir()
    out = tmp_path / where
    assert main(["plot", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and ".tmp" not in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_directory", "run"]


def test_an_empty_out_is_refused_not_replaced_by_the_default(tmp_path, capsys):
    """`glassllm plot RUN --out ""` wrote RUN/loss.png, the default, without a word."""
    run = write_csv(tmp_path)
    assert main(["plot", str(run), "--out", ""]) == 2
    err = capsys.readouterr().err
    assert "empty" in err and err.count("\n") == 1, err
    assert not (run / "loss.png").exists()
    with pytest.raises(ValueError, match="empty"):
        plot_history(str(run / "history.csv"), "")
