"""Screenshots of a demo's MLflow store as a first-time visitor sees it (not run in CI).

    python scripts/mlflow_screenshots.py --backend-store-uri sqlite:////PATH/mlflow.db --out DIR \\
        [--experiment specrank-demo] [--pipeline demo-t1] [--chromium chromium]

Starts ``mlflow ui`` on 127.0.0.1 over the store, then headless Chromium (a fresh, empty profile per page:
no remembered view) takes PNGs of: the experiment as a first visit opens it (bare, and through the link the
demo prints, which opens the saved headline view), the pipeline run (overview and its report.html), the champion's registered version, and one
Optuna study (its run, and its optimisation-history figure). Needs ``apt-get install -y chromium``. Prints
each file and the URL it shows.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from specrank.tracking.server import local_mlflow

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


def shoot(chromium: str, url: str, png: Path, width: int = 1920, height: int = 1000, wait_ms: int = 90000,
          tries: int = 3) -> None:
    """One PNG of ``url`` after ``wait_ms`` of (virtual) page time, in a fresh profile; MLflow's metric charts
    need about a minute of it to draw. On a busy machine a page (the HTML artifact's frame) sometimes comes
    out blank: such a shot is taken again, up to ``tries`` times."""
    for _ in range(tries):
        with tempfile.TemporaryDirectory() as profile:
            cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--virtual-time-budget={wait_ms}", f"--screenshot={png}", url]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        if not blank(png):
            return
    print(f"{png}: still blank after {tries} tries")


def blank(png: Path) -> bool:
    """Whether the page's main panel (right of the side bar, left of the assistant) is nearly all white."""
    from PIL import Image

    with Image.open(png) as image:
        w, h = image.size
        panel = image.convert("L").crop((int(0.27 * w), int(0.1 * h), int(0.6 * w), int(0.6 * h)))
        dark = sum(panel.histogram()[:200])
        return dark < 0.002 * panel.width * panel.height


def pages(store: str, experiment: str, pipeline: str) -> dict[str, tuple[str, int]]:
    """{file stem: (URL fragment, page height)} of the pages to capture, found through MLflow's client."""
    from mlflow import MlflowClient

    from specrank.experiments.study.study_tracking import runs_link
    from specrank.tracking.runs import WORKFLOW_PARAM
    from specrank.workflow import Tracking

    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"no experiment {experiment!r} in {store}")
    e = exp.experiment_id
    runs = {r.info.run_name: r for r in client.search_runs([e], max_results=1000)}
    run = runs[pipeline].info.run_id
    train = runs[Tracking.stage(store, experiment, pipeline, "train").run_name].info.run_id
    studies = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == train and "study" in r.data.params]
    study = sorted(studies, key=lambda r: r.info.run_name)[-1].info.run_id  # .../rows-fold1 sorts last
    champion = client.get_model_version_by_alias(pipeline, "champion")
    ml = f"?{WORKFLOW_PARAM}"  # the Model training view, as the demo's printed link opens it
    return {
        "0-landing-default": (f"#/experiments/{e}", 1000),  # a first visit without the link: MLflow's default
        "1-landing": (runs_link(e).split("/", 3)[3], 1000),  # the link the demo and the study print
        "2-pipeline-run": (f"#/experiments/{e}/runs/{run}{ml}", 1800),
        "3-pipeline-report": (f"#/experiments/{e}/runs/{run}/artifacts/report.html{ml}", 2000),
        "4-champion": (f"#/models/{pipeline}/versions/{champion.version}{ml}", 1400),
        "5-optuna-study": (f"#/experiments/{e}/runs/{study}{ml}", 1600),
        "6-optuna-history": (f"#/experiments/{e}/runs/{study}/artifacts/figures/optimization_history.png{ml}", 1000),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend-store-uri", required=True, help="the demo's store, e.g. sqlite:////path/mlflow.db")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    parser.add_argument("--experiment", default="specrank-demo")
    parser.add_argument("--pipeline", default="demo-t1", help="the pipeline run whose evaluation and model to show")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    targets = pages(args.backend_store_uri, args.experiment, args.pipeline)
    ui = ["--backend-store-uri", args.backend_store_uri]
    with tempfile.TemporaryDirectory() as tmp, local_mlflow("ui", ui, Path(tmp) / "ui.log", start_timeout=120) as base:
        for stem, (fragment, height) in targets.items():
            png = args.out / f"{stem}.png"
            shoot(args.chromium, f"{base}/{fragment}", png, height=height)
            print(f"{png}: {fragment}")


if __name__ == "__main__":
    main()
