"""Pages that open from disk, with no network: the dataset viewer, an evaluation's `report.html`, a training
run's `index.html`, and pages over several runs or evaluations (docs/viewer_and_reports.md).

One job per module: `html` (the page shell, escaping, inline JSON, tables), `plots_js` (the SVG charts'
script), `dataset_viewer` and `viewer_js` (the viewer), `rerun_export` (episodes as a rerun recording),
`eval_report`, `run_index`, `runs_page`. This package reads datasets and run directories; it imports neither
`lerobot.cli` nor `lerobot.training`, which call into it (`try_write_eval_report` after `eval_info.json` is
written, `try_write_run_index` when a run's curves are redrawn): a page that cannot be written is a warning,
never a failed evaluation or training run.
"""

from lerobot.reports.eval_report import try_write_eval_report, write_eval_report
from lerobot.reports.run_index import try_write_run_index, write_run_index

__all__ = ["try_write_eval_report", "try_write_run_index", "write_eval_report", "write_run_index"]
