"""Profile runs read from a tracking store: what each one measured, on which machine, with which settings;
runs that cannot be compared are listed with the reason.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pipeline.common.errors import PipelineError
from pipeline.common.machine import machine_id, machine_name
from pipeline.records.profile import METRIC_PREFIX, Combination
from pipeline.records.quantities import Interval
from pipeline.tracking.store import check_tracking_server
from pipeline.tracking.tags import ID_TAG, NAME_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Experiment, Run
from pipeline.tracking.tags import HARDWARE_PREFIX, MODEL_DIGEST_TAG

PROFILE_STAGE = "profile"
COMBINATION_PARAMS = ("batch_size", "device", "mode")
# Run params that do not change what is measured: the machine's own thread count (0 = one per core
# gives 2 on a laptop, 16 on a server), how many untimed steps warm each step up first (every timed block follows a
# probe of the same step, so it times the step warm however many there were), how long the timing may run, how tight
# it aims and in how many processes (they set the width of the interval, which the report shows), how many steps are
# traced for the operator table, and how long the allocator what-if runs (beside the measurement). The allocator
# itself is the machine's environment, like its `hardware.*`: its description names each machine's glibc version.
NOT_SETTINGS = frozenset(
    {
        "threads",
        "profile.threads",
        "profile.top_k",
        "profile.warmup_steps",
        "profile.active_steps",
        "profile.ci_target_pct",
        "profile.time_budget_s",
        "profile.processes",
        "profile.program_starts",
        "profile.processes_at_once",
        "profile.allocator_whatif_s",
        "allocator",
    }
)
STATISTICS = {"median": "median of timed blocks with its 95 % CI", "mean": "mean of timed steps (older runs)"}
# Metric names of the timing statistics, with the mean/CV of the simple timing as fallback.
MEDIAN_METRIC, CI_LOW_METRIC, CI_HIGH_METRIC, NOISY_METRIC = (
    "step_time_ms_median",
    "step_time_ms_ci_low",
    "step_time_ms_ci_high",
    "noisy",
)
MEAN_METRIC, CV_METRIC = "step_time_ms_mean", "step_time_cv"
BUSY_METRIC = "machine_busy"  # the load average exceeded the cores while timing (pipeline.records.statistics)
SEARCH_PAGE = 1000


@dataclass(frozen=True)
class Machine:
    id: str
    name: str


@dataclass(frozen=True)
class StepTime:
    """One run's step-time estimate in ms; `low`/`high` bound a 95 % confidence interval where logged."""

    value: float
    statistic: Literal["median", "mean"]
    low: float | None = None
    high: float | None = None
    cv: float | None = None  # stdev / mean of the timed steps (mean estimates only)
    noisy: bool = False  # the run's own verdict: its interval missed the target width
    busy: bool = False  # the machine was busier than its cores while timing: times inflated, interval too narrow

    @property
    def interval(self) -> Interval | None:
        """The 95 % interval (an end at 0: too few timed blocks to bound anything); None for a mean."""
        if self.low is None or self.high is None:
            return None
        return Interval(self.value, self.low, self.high)


@dataclass(frozen=True)
class ProfileRun:
    """One FINISHED `profile@...` run, as the report needs it."""

    run_id: str
    started_ms: int
    machine: Machine
    combination: Combination
    device_name: str
    model_digest: str
    settings: tuple[tuple[str, str], ...]
    environment: dict[str, str]  # the `hardware.*` tags (params in older runs), prefix removed
    threads: str
    step_time: StepTime
    peak_memory_mb: float | None = None  # what the step holds at its peak (runs from before it was measured: None)
    energy_mj_per_sample: float | None = None  # where the device had an energy counter


@dataclass(frozen=True)
class LeftOut:
    run_id: str
    reason: str


def profile_run(run: Run) -> ProfileRun | LeftOut:
    """Read one MLflow run; a run that cannot be placed is left out with the reason."""
    params, tags = run.data.params, run.data.tags
    # Metrics carry a `profile/` prefix since the stage grouped them; older runs in a shared store have none.
    metrics = {
        **run.data.metrics,
        **{key[len(METRIC_PREFIX) :]: v for key, v in run.data.metrics.items() if key.startswith(METRIC_PREFIX)},
    }
    missing = [name for name in COMBINATION_PARAMS if name not in params]
    if missing:
        return LeftOut(run.info.run_id, f"no {', '.join(f'`{name}`' for name in missing)} param(s)")
    if not params["batch_size"].isdigit():
        return LeftOut(run.info.run_id, f"`batch_size` param is {params['batch_size']!r}")
    combination = Combination(int(params["batch_size"]), params["device"], params["mode"])  # type: ignore[arg-type]
    digest = tags.get(MODEL_DIGEST_TAG)
    if not digest:
        return LeftOut(run.info.run_id, f"no `{MODEL_DIGEST_TAG}` tag (logged before the tag existed)")
    # `hardware.*` are tags (older runs logged them as params; a shared store holds both kinds).
    environment = {
        key[len(HARDWARE_PREFIX) :]: value
        for key, value in {**params, **tags}.items()
        if key.startswith(HARDWARE_PREFIX)
    }
    if tags.get(ID_TAG) and tags.get(NAME_TAG):
        machine = Machine(tags[ID_TAG], tags[NAME_TAG])
    elif environment:  # logged before the machine tags existed: the same identity, from its params
        machine = Machine(machine_id(environment), machine_name(environment))
    else:
        return LeftOut(run.info.run_id, "no `machine.*` tags and no `hardware.*` tags or params")
    if MEDIAN_METRIC in metrics:
        step_time = StepTime(
            value=metrics[MEDIAN_METRIC],
            statistic="median",
            low=metrics.get(CI_LOW_METRIC),
            high=metrics.get(CI_HIGH_METRIC),
            noisy=bool(metrics.get(NOISY_METRIC, 0.0)),
            busy=bool(metrics.get(BUSY_METRIC, 0.0)),
        )
    elif MEAN_METRIC in metrics:
        step_time = StepTime(value=metrics[MEAN_METRIC], statistic="mean", cv=metrics.get(CV_METRIC))
    else:
        return LeftOut(run.info.run_id, f"no `{MEDIAN_METRIC}` or `{MEAN_METRIC}` metric")
    if not step_time.value > 0 or not math.isfinite(step_time.value):
        return LeftOut(run.info.run_id, f"step time {step_time.value!r} ms is not a positive number")
    settings = tuple(
        sorted(
            (key, value)
            for key, value in params.items()
            if key not in COMBINATION_PARAMS and key not in NOT_SETTINGS and not key.startswith(HARDWARE_PREFIX)
        )
    )
    return ProfileRun(
        run_id=run.info.run_id,
        started_ms=int(run.info.start_time or 0),
        machine=machine,
        combination=combination,
        device_name=environment.get("device_name", combination.device),
        model_digest=digest,
        settings=settings,
        environment=environment,
        threads=params.get("threads", "?"),
        step_time=step_time,
        peak_memory_mb=metrics.get("memory_peak_mb"),
        energy_mj_per_sample=1000 * metrics["energy_j_per_sample"] if "energy_j_per_sample" in metrics else None,
    )


def search_profile_runs(client: MlflowClient, experiment_id: str) -> list[Run]:
    """Every FINISHED profile run of the experiment, newest first (all pages)."""
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.stage = '{PROFILE_STAGE}' and attributes.status = 'FINISHED'",
            max_results=SEARCH_PAGE,
            order_by=["attributes.start_time DESC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


# --- reading the store and writing the report ------------------------------------------------------


def search_all_experiments(client: MlflowClient) -> list[Experiment]:
    """Every active experiment the account may read (all pages)."""
    found: list[Experiment] = []
    token: str | None = None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        found += page
        token = page.token
        if not token:
            return found


def read_store(uri: str, experiment: str) -> tuple[list[ProfileRun], list[LeftOut]]:
    """The experiment's FINISHED profile runs from the store at `uri`, read and sorted out."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    check_tracking_server(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        raise PipelineError(
            f"No MLflow store at {uri[len('sqlite:///') :]}: run `dvc repro` here first, or set "
            "$MLFLOW_TRACKING_URI to the store the machines log to (README: 'Comparing machines')."
        )
    client = MlflowClient(uri)
    try:
        if any(character in experiment for character in "*?["):  # a pattern: every student's experiment
            found = [e for e in search_all_experiments(client) if fnmatch.fnmatchcase(e.name, experiment)]
        else:
            single = client.get_experiment_by_name(experiment)
            found = [single] if single is not None else []
        if not found:
            known = ", ".join(sorted(e.name for e in search_all_experiments(client))) or "none"
            raise PipelineError(
                f"The MLflow store {uri} has no experiment {experiment!r} (it has: {known}). Pass --experiment "
                "(a name, or a pattern such as 'mnist-lab-*' for a class server), or check $MLFLOW_TRACKING_URI."
            )
        results = [profile_run(run) for each in found for run in search_profile_runs(client, each.experiment_id)]
    except MlflowException as error:
        raise PipelineError(f"Reading the MLflow store {uri} failed: {error.message}") from None
    runs = [result for result in results if isinstance(result, ProfileRun)]
    return runs, [result for result in results if isinstance(result, LeftOut)]
