"""glassllm.lens.plots and `glassllm plot`: history files -> a loss/lr PNG."""
import math

import numpy as np
import pytest

from glassllm.cli import main
from glassllm.lens.plots import find_history, plot_history, read_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

CSV = """step,train_loss,val_loss,lr,tokens_per_s
0,5.6,5.5,0.0001,100
1,5.1,,0.0002,110
2,4.7,,0.0003,
3,4.2,4.3,0.0003,120
bad,1,1,1,1
"""


# matplotlib's default colour cycle (train: C0, validation: C1) and the lr curve's tab:green
TRAIN, VAL, LR = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C)


def pixels_of(image: np.ndarray, rgb) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns) of the pixels within a small distance of a colour (anti-aliasing)."""
    distance = np.abs(image[..., :3].astype(int) - np.array(rgb)).sum(axis=-1)
    return np.nonzero(distance < 40)


def assert_png(path, falling_train=True, rising_lr=True):
    """A real 800 x 600 PNG with the three curves drawn where they belong: the train line
    (C0) and validation markers (C1) in the loss panel (the upper three quarters), the lr
    line (green) in the lower panel; the train loss falls left to right (its pixels sit
    higher on the left), the lr rises. A blank or empty figure fails every check."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    # IHDR: width and height of the 8x6 inch, 100 dpi figure.
    assert int.from_bytes(data[16:20], "big") == 800 and int.from_bytes(data[20:24], "big") == 600
    from matplotlib.image import imread
    image = np.asarray(imread(path)[..., :3] * 255, dtype=np.uint8)
    assert image.shape == (600, 800, 3)
    split = 600 * 3 // 4
    (train_rows, train_cols), (val_rows, _), (lr_rows, lr_cols) = (
        pixels_of(image, colour) for colour in (TRAIN, VAL, LR))
    assert train_rows.size > 300 and val_rows.size > 20 and lr_rows.size > 300, \
        (train_rows.size, val_rows.size, lr_rows.size)
    assert train_rows.max() < split and val_rows.max() < split and lr_rows.min() > split * 0.9

    def left_minus_right(rows, cols):  # mean pixel row at the left end minus the right end
        left, right = cols <= np.percentile(cols, 10), cols >= np.percentile(cols, 90)
        return rows[left].mean() - rows[right].mean()
    if falling_train:  # image rows grow downwards: a falling curve starts at smaller rows
        assert left_minus_right(train_rows, train_cols) < -50
    if rising_lr:
        assert left_minus_right(lr_rows, lr_cols) > 20


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


def test_cli_plot_of_a_history_file_names_the_directory_to_give(tmp_path, capsys):
    """`glassllm plot run/history.csv` said "run directory not found" of a file that exists."""
    (tmp_path / "history.csv").write_text(CSV)
    assert main(["plot", str(tmp_path / "history.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"glassllm plot: error: RUN_DIR {tmp_path / 'history.csv'} is a file; give "
                   f"the directory holding a run's history.csv: glassllm plot {tmp_path}")


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
