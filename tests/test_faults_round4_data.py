"""Nothing lost, nothing silent, round four (data): a dataset path derived from a setting (`dataset.repo_id`)
or from a dataset's own files (`meta/info.json`) stays under its root, and a recording keeps its evaluation
whatever happens to the directory it records into. Each case runs the real fault: a real path traversal
against a victim directory, a real second recording racing for the same directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_faults_round3 import RANDOM_EVAL, REPO, _child_env, _error_lines
from test_lerobot_dataset_images import DATA_FILE, DATASET, IMAGE, _env, _to_v21
from test_train import TINY

from lerobot.cli import eval_main, train_main
from lerobot.config import DatasetConfig
from lerobot.datasets import make_dataset
from lerobot.datasets.lerobot_format import EPISODES_PATH, INFO_PATH, STATS_PATH
from lerobot.datasets.lerobot_import import convert_lerobot_dataset
from lerobot.datasets.recording import EpisodeRecorder
from lerobot.errors import ConfigError, DatasetError
from lerobot.runtime.files import TemporaryDir

REPO_ID_ERROR = "is not a hub id <owner>/<name>"


def _victim(tmp_path: Path) -> Path:
    """A directory outside every dataset root holding a file that must survive: `<tmp>/victim/v1/keep.txt`."""
    keep = tmp_path / "victim" / "v1" / "keep.txt"
    keep.parent.mkdir(parents=True)
    keep.write_text("precious")
    return keep


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------- repo ids (row 2)
def test_a_repo_id_that_climbs_out_of_the_cache_replaces_no_directory_of_the_cli(tmp_path, capsys):
    # <cache>/lerobot_datasets/../../victim/v1 is <tmp>/victim/v1: the conversion used to be renamed over it.
    keep = _victim(tmp_path)
    args = [*TINY, "env=pusht_keypoints", "training.steps=1", f"output_dir={tmp_path / 'run'}"]
    data = [
        f"dataset.root={DATASET}",
        "dataset.repo_id=../../victim",
        f"dataset.cache_dir={tmp_path / 'cache'}",
    ]
    assert train_main([*args, *data]) == 2
    assert _error_lines(capsys.readouterr().err) == [
        "error: dataset.repo_id='../../victim' is not a hub id <owner>/<name> (e.g. lerobot/pusht: two "
        "non-empty parts of letters, digits, '_', '-', '.', without '..'); a dataset directory goes in "
        "dataset.root=DIR"
    ]
    assert keep.read_text() == "precious" and sorted(p.name for p in keep.parent.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    "repo_id",
    ["../../victim", "owner/../../../victim", "{tmp}/victim", "owner//victim", "victim", "owner/victim/"],
)
def test_repo_ids_that_are_no_hub_ids_are_refused_by_the_dataset_factory(tmp_path, repo_id):
    keep = _victim(tmp_path)
    repo_id = repo_id.format(tmp=tmp_path)  # an absolute id: `<cache>/lerobot_datasets/<id>` is `<id>`
    cfg = DatasetConfig(repo_id=repo_id, root=str(DATASET), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as excinfo:
        make_dataset(cfg, _env())
    assert f"dataset.repo_id={repo_id!r} {REPO_ID_ERROR}" in _one_line(excinfo)
    assert keep.read_text() == "precious" and sorted(p.name for p in keep.parent.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "cache").exists()


def test_a_repo_id_cannot_read_a_dataset_outside_lerobots_home(tmp_path, monkeypatch):
    # `$HF_LEROBOT_HOME/x/../../elsewhere` is `<tmp>/elsewhere`, a dataset nobody pointed dataset.root at.
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "x").mkdir(parents=True)  # an owner's directory, as LeRobot's home holds them
    shutil.copytree(DATASET, tmp_path / "elsewhere")
    cfg = DatasetConfig(repo_id="x/../../elsewhere", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as excinfo:
        make_dataset(cfg, _env())
    assert REPO_ID_ERROR in _one_line(excinfo)
    assert not (tmp_path / "cache").exists()
    # A hub id there is read as before.
    shutil.copytree(DATASET, tmp_path / "home" / "owner" / "name")
    assert make_dataset(DatasetConfig(repo_id="owner/name", cache_dir=str(tmp_path / "cache")), _env())


def test_an_env_name_that_is_a_path_makes_no_directory_outside_outputs(tmp_path, monkeypatch, capsys):
    # outputs/eval/<date>/<time>_<env.name>_<policy>, the default evaluation directory: a/escaped_random here.
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    name = "../../../../../../../escaped"
    assert eval_main([*RANDOM_EVAL, "eval.n_episodes=1", f"env.name={name}"]) == 2
    assert _error_lines(capsys.readouterr().err) == [
        f"error: env.name={name!r} is not a plain name (letters, digits, '_', '-', '.'): it names the run's "
        "directory (<time>_<env>_<policy>); pick one without '/'"
    ]
    assert [p.name for p in tmp_path.rglob("*") if p.is_dir()] == ["a", "b", "work"]


# ----------------------------------------------------------------------- info.json templates (row 8)
V3_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


def _set_info(root: Path, **values: object) -> None:
    info = json.loads((root / INFO_PATH).read_text())
    (root / INFO_PATH).write_text(json.dumps({**info, **values}))


def _data_outside(root: Path, outside: Path, template: str) -> None:
    """Move the dataset's parquet files to `outside` (where `template` points them) and set `data_path`."""
    for path in sorted((root / "data").rglob("*.parquet")):
        target = outside / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
    _set_info(root, data_path=template)


def _as_video(root: Path, video_path: str) -> None:
    """The camera declared as a video, each episode pointing at `video_path` (the import refuses it before it
    decodes anything)."""
    info = json.loads((root / INFO_PATH).read_text())
    info["features"][IMAGE]["dtype"] = "video"
    _set_info(root, features=info["features"], video_path=video_path)
    path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    table = pq.read_table(path)
    zeros = pa.array([0] * table.num_rows, pa.int64())
    for name, column in (
        ("chunk_index", zeros),
        ("file_index", zeros),
        ("from_timestamp", zeros.cast("float64")),
    ):
        table = table.append_column(f"videos/{IMAGE}/{name}", column)
    pq.write_table(table, path)


def _feature_named_as_a_path(root: Path, name: str) -> None:
    """Rename feature `observation.state` to `name` everywhere the import reads it."""
    info = json.loads((root / INFO_PATH).read_text())
    info["features"][name] = info["features"].pop("observation.state")
    _set_info(root, features=info["features"])
    stats = json.loads((root / STATS_PATH).read_text())
    stats[name] = stats.pop("observation.state")
    (root / STATS_PATH).write_text(json.dumps(stats))
    table = pq.read_table(root / DATA_FILE)
    pq.write_table(
        table.rename_columns([name if c == "observation.state" else c for c in table.column_names]),
        root / DATA_FILE,
    )


BAD_INFO = {
    "data_path climbing out": (
        lambda root, out: _data_outside(root, out, "../outside/" + V3_DATA),
        "data_path='../outside/data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet' names "
        "'../outside/data/chunk-000/file-000.parquet', outside the dataset directory",
    ),
    "absolute data_path": (
        lambda root, out: _data_outside(root, out, f"{out}/{V3_DATA}"),
        "/outside/data/chunk-000/file-000.parquet', outside the dataset directory",
    ),
    "video_path climbing out": (
        lambda root, out: _as_video(root, "../outside/{video_key}/file-{file_index:03d}.mp4"),
        "video_path='../outside/{video_key}/file-{file_index:03d}.mp4' names "
        f"'../outside/{IMAGE}/file-000.mp4', outside the dataset directory",
    ),
    "a bad format spec": (  # used to be a ValueError traceback
        lambda root, out: _set_info(root, data_path="data/chunk-{chunk_index:s}/file.parquet"),
        "data_path='data/chunk-{chunk_index:s}/file.parquet' is not a valid path template (ValueError: ",
    ),
    "a positional field": (  # used to be an IndexError traceback
        lambda root, out: _set_info(root, data_path="data/{0}.parquet"),
        "data_path='data/{0}.parquet' uses ['0']; a data_path template may use only "
        "['chunk_index', 'file_index']",
    ),
    "a feature named as a path": (  # its `.npy` used to be written two directories above the conversion
        lambda root, out: _feature_named_as_a_path(root, "../../evil"),
        "feature name '../../evil' holds a '/' (or NUL); a feature name is a file name of the conversion",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INFO))
def test_info_json_cannot_point_the_import_outside_the_dataset(tmp_path, case):
    root = shutil.copytree(DATASET, tmp_path / "ds")
    damage, expected = BAD_INFO[case]
    damage(root, tmp_path / "outside")
    with pytest.raises(DatasetError) as excinfo:
        convert_lerobot_dataset(root, tmp_path / "out" / "v1")
    message = _one_line(excinfo)
    assert message.startswith(f"{root / INFO_PATH}: ") and expected in message
    assert not (tmp_path / "out" / "v1").exists()
    assert not list(tmp_path.rglob("evil.npy"))


def test_a_v21_data_path_climbing_out_is_refused(tmp_path):
    root = _to_v21(DATASET, tmp_path / "v21")
    _data_outside(root, tmp_path / "outside", "../outside/data/chunk-000/episode_{episode_index:06d}.parquet")
    with pytest.raises(DatasetError) as excinfo:
        convert_lerobot_dataset(root, tmp_path / "out" / "v1")
    assert "names '../outside/data/chunk-000/episode_000000.parquet', outside the dataset directory" in (
        _one_line(excinfo)
    )


# -------------------------------------------------------------------------- recordings (row 7, extra)
RECORD = [*RANDOM_EVAL, "env.max_episode_steps=10", "eval.max_episodes_rendered=0"]


def test_the_readmes_record_dataset_in_a_fresh_directory_makes_its_parents(tmp_path, monkeypatch):
    # The README's `eval.record_dataset=outputs/data/<name>`, run where no outputs/ exists yet.
    monkeypatch.chdir(tmp_path)
    assert eval_main([*RECORD, "eval.n_episodes=2", "eval.record_dataset=outputs/data/a/b/c"]) == 0
    record = tmp_path / "outputs" / "data" / "a" / "b" / "c"
    assert json.loads((record / INFO_PATH).read_text())["total_episodes"] == 2
    assert sorted(p.name for p in record.parent.iterdir()) == ["c"]  # no temporary left beside it
    (info,) = (tmp_path / "outputs" / "eval").glob("*/*/eval_info.json")
    assert json.loads(info.read_text())["aggregated"]["n_episodes"] == 2


def _rival_records_into(record: Path, out: Path) -> None:
    """Another evaluation, in its own process, records one episode into `record` and ends."""
    rival = subprocess.run(
        [sys.executable, "scripts/eval.py", *RECORD, "eval.n_episodes=1", f"eval.record_dataset={record}",
         "--output-dir", str(out)],
        cwd=REPO, env=_child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rival.returncode == 0, rival.stderr[-3000:]


@pytest.mark.parametrize("when", ["before the export", "at the rename into place"])
def test_the_recording_that_loses_the_race_for_its_directory_keeps_its_evaluation(
    tmp_path, monkeypatch, capsys, when
):
    # Both evaluations found `record` free at start; the rival finishes its recording first, either before
    # this one exports or while it exports (then both passed the export's own check: the loser used to delete
    # the rival's dataset and put its own in place).
    record, out = tmp_path / "datasets" / "rollouts", tmp_path / "eval"
    record.parent.mkdir()
    hooked = (EpisodeRecorder, "write") if when == "before the export" else (TemporaryDir, "install")
    original = getattr(*hooked)

    def rival_first(self, *args, **kwargs):
        _rival_records_into(record, tmp_path / "rival_eval")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(*hooked, rival_first)
    assert (
        eval_main([*RECORD, "eval.n_episodes=2", f"eval.record_dataset={record}", "--output-dir", str(out)])
        == 2
    )
    assert _error_lines(capsys.readouterr().err) == [
        f"error: eval.record_dataset={record} was not written: another recording took that directory while "
        f"this evaluation ran (its dataset is kept); this evaluation's figures are in "
        f"{out / 'eval_info.json'}; record into a new directory to keep its episodes"
    ]
    info = json.loads((out / "eval_info.json").read_text())
    assert info["aggregated"]["n_episodes"] == 2 and len(info["per_episode"]) == 2
    # The rival's dataset (one episode) is the one there, whole, and nothing else is left beside it.
    assert json.loads((record / INFO_PATH).read_text())["total_episodes"] == 1
    assert sorted(p.name for p in record.parent.iterdir()) == ["rollouts"]
