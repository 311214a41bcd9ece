"""lm-evaluation-harness tasks inside ``kvbridge harness`` (``--lm-eval-task NAME|FILE.yaml``).

A task is found without building lm-eval's whole index: a YAML file given by path, or the file whose
``task:`` is NAME under ``--lm-eval-include`` and then lm-eval's own task folder. Its data source is
read from the YAML (includes followed, ``!function`` never imported at this stage): a task whose
data lives on the Hugging Face hub is refused with a one-line error saying how to point it at local
files (kvbridge never downloads); a local task (``dataset_path: json``/``csv``/``parquet``/``text``
with ``dataset_kwargs.data_files``, or a local dataset folder) is loaded by lm-eval itself.

Each document becomes one item; under each condition the document's requests (lm-eval's own
prompts, few-shot context included) are answered by :class:`kvbridge.harness.lm_eval_model.KVBridgeLM`
with that condition, lm-eval's filters are applied and ``process_results`` scores them; the item's
score is the task's first metric (``acc`` for multiple choice, ``exact_match`` ...), which must lie
in [0, 1].
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

from kvbridge.harness.protocol import GenItem, HarnessError

#: ``datasets`` builders that read local files
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas")
PIN = "lm-eval==0.4.13"


@dataclass(frozen=True)
class LmEvalSpec:
    name: str
    yaml_path: str
    include_path: str


@dataclass(frozen=True)
class LmEvalOptions:
    num_fewshot: int = -1  # -1: the task's own setting


def _lm_eval_dir() -> Path:
    from importlib import util

    spec = util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError("lm-eval tasks need the package lm-eval", f"pip install {PIN} (make test installs it)")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks"


def find_yaml(name: str, include_path: str | None = None) -> Path:
    """The YAML file that defines task ``name`` (a path to a YAML file is taken as it is)."""
    p = Path(name).expanduser()
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise HarnessError(f"lm-eval task file not found: {p}", "pass an existing task YAML")
        return p.resolve()
    pattern = re.compile(rf"^task:\s*['\"]?{re.escape(name)}['\"]?\s*$", re.M)
    group = re.compile(rf"^(group|tag):\s*['\"]?{re.escape(name)}['\"]?\s*$", re.M)
    roots = ([Path(include_path)] if include_path else []) + [_lm_eval_dir()]
    grouped = None
    for root in roots:
        for path in sorted(root.rglob("*.yaml")):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if pattern.search(text):
                return path
            if grouped is None and group.search(text):
                grouped = path
    if grouped is not None:
        raise HarnessError(
            f"lm-eval name {name!r} is a group or tag ({grouped.name}), not a single task",
            "pass its member tasks one by one with --lm-eval-task",
        )
    raise HarnessError(
        f"unknown lm-eval task {name!r}",
        "pass a task name from `lm-eval ls tasks`, or a task YAML file (with --lm-eval-include for a folder)",
    )


def task_config(path: Path) -> dict:
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        return load_yaml(path, resolve_func=False, recursive=True)
    except Exception as exc:  # noqa: BLE001 - a malformed YAML of the user's: one line
        raise HarnessError(
            f"cannot read lm-eval task {path} ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})",
            "fix the task YAML",
        ) from None


def check_local(name: str, cfg: dict, path: Path) -> None:
    """Refuse a task whose data is on the hub (one line saying how to point it at local files)."""
    dp = cfg.get("dataset_path")
    kwargs = cfg.get("dataset_kwargs") or {}
    files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    if dp in LOCAL_BUILDERS and files:
        flat = [files] if isinstance(files, str) else (list(files.values()) if isinstance(files, dict) else list(files))
        for f in flat:
            for one in [f] if isinstance(f, str) else list(f):  # relative: to the cwd or to the task's folder
                if "://" not in str(one) and not Path(one).exists() and not (path.parent / one).exists():
                    raise HarnessError(
                        f"lm-eval task {name!r}: data file {one} not found", f"fix dataset_kwargs.data_files in {path}"
                    )
        return
    if isinstance(dp, str) and dp and Path(dp).expanduser().is_dir():
        return
    raise HarnessError(
        f"lm-eval task {name!r} reads its data from the Hugging Face hub (dataset_path: {dp}) and kvbridge never "
        "downloads",
        f"copy {path.name}, set dataset_path: json and dataset_kwargs: {{data_files: {{test: /path/to/test.jsonl}}}} "
        "(with test_split: test), and pass that YAML to --lm-eval-task",
    )


def lm_eval_task_specs(names, include_path: str | None = None) -> list[LmEvalSpec]:
    """Resolve and check ``--lm-eval-task`` values before any model loads."""
    out = []
    for name in names:
        path = find_yaml(name, include_path)
        cfg = task_config(path)
        task = cfg.get("task") or name
        if not isinstance(task, str):
            raise HarnessError(f"{path} defines no single task (task: {task!r})", "pass a task YAML with task: NAME")
        check_local(task, cfg, path)
        out.append(LmEvalSpec(task, str(path), str(Path(include_path).resolve()) if include_path else str(path.parent)))
    return out


class LmEvalTask:
    """One lm-eval task as a harness task (see the module docstring)."""

    Options = LmEvalOptions
    no_context = False
    executes_code = False

    def __init__(self, spec: LmEvalSpec):
        self.spec = spec
        self.name = f"lm-eval:{spec.name}"
        self._task = None
        self._lms: dict = {}

    def _load(self, options: LmEvalOptions):
        import logging

        from lm_eval.tasks import TaskManager

        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        tm = TaskManager(include_path=self.spec.include_path, include_defaults=False)
        task = tm.load([self.spec.name])["tasks"].get(self.spec.name)
        if task is None:
            raise HarnessError(
                f"lm-eval did not load task {self.spec.name!r} from {self.spec.yaml_path}",
                "check the YAML with `lm-eval validate --tasks NAME --include_path DIR`",
            )
        if options.num_fewshot >= 0:
            task.set_config(key="num_fewshot", value=int(options.num_fewshot))
        return task

    def items(self, options: LmEvalOptions, tokenizer) -> list:
        self._task = task = self._load(options)
        task.build_all_requests(rank=0, world_size=1)
        by_doc: dict = {}
        for inst in task.instances:
            by_doc.setdefault(inst.doc_id, []).append(inst)
        items = []
        for doc_id, insts in sorted(by_doc.items()):
            insts = sorted(insts, key=lambda i: i.idx)
            ctx = insts[0].args[0] if insts[0].args and isinstance(insts[0].args[0], str) else ""
            meta = {"doc_id": doc_id, "instances": insts, "doc": insts[0].doc}
            items.append(GenItem(f"{self.spec.name}-{doc_id}", ctx, "", None, meta=meta))
        return items

    def answer(self, answerer, cond: str, item: GenItem):
        """``(score, shown answer)``: the document's requests answered under ``cond``, filtered and scored by lm-eval."""
        from kvbridge.harness.lm_eval_model import KVBridgeLM

        task, key = self._task, (id(answerer), cond)
        if key not in self._lms:
            self._lms[key] = KVBridgeLM(answerer=answerer, condition=cond)
        lm = self._lms[key]
        insts = [copy.copy(i) for i in item.meta["instances"]]
        kind = insts[0].request_type
        resps = getattr(lm, {"multiple_choice": "loglikelihood"}.get(kind, kind))(insts)
        for inst, r in zip(insts, resps):
            inst.resps, inst.filtered_resps = [r], {}
        filters = getattr(task, "_filters", None) or []
        for f in filters:
            f.apply(insts)
        key = filters[0].name if filters else None
        results = [i.filtered_resps[key] if key else i.resps[0] for i in insts]
        metrics = task.process_results(item.meta["doc"], results)
        names = [m.get("metric") for m in (task.config.metric_list or []) if isinstance(m, dict)]
        primary = next((m for m in names if m in metrics), None) or next(iter(metrics))
        score = float(metrics[primary])
        if not 0 <= score <= 1:
            raise HarnessError(
                f"lm-eval task {self.spec.name!r}: metric {primary!r} is {score}, not a 0..1 item score",
                "use a task whose first metric is acc or exact_match",
            )
        mc = getattr(task, "OUTPUT_TYPE", None) == "multiple_choice"
        shown = max(range(len(resps)), key=lambda i: resps[i][0]) if mc else str(results[0])[:300]
        return score, shown

    def score(self, item, completion: str) -> float:  # pragma: no cover - answer() scores
        raise HarnessError("lm-eval items are scored by lm-eval", "report this as a bug")

    def chance(self, item) -> float:
        insts = item.meta["instances"]
        mc = getattr(self._task, "OUTPUT_TYPE", None) == "multiple_choice"
        return 1.0 / len(insts) if insts and mc else 0.0


def lm_eval_loaded_tasks(specs, options: dict | None = None) -> list:
    """:class:`kvbridge.harness.run.LoadedTask` records for checked specs."""
    from kvbridge.fit.protocol import build_options
    from kvbridge.harness.run import LoadedTask

    names = {f"lm-eval:{s.name}" for s in specs}
    stray = [k for k in (options or {}) if k not in names]
    if stray:
        raise HarnessError(
            f"-o names {stray[0]!r}, which is not an --lm-eval-task", f"use one of {', '.join(sorted(names))}"
        )
    out = []
    for spec in specs:
        task = LmEvalTask(spec)
        opts = build_options(LmEvalOptions, (options or {}).get(task.name), owner=f"task {task.name!r}")
        out.append(LoadedTask(task.name, task, opts, f"lm-eval task {spec.name} ({spec.yaml_path})", "lm-eval"))
    return out
