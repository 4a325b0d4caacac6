"""The record a run leaves in its model directory: the configuration it used.

`MODEL_DIR/config.yaml` holds every option's value (after the `--config`
file and the flags) and, under `resolved`, what the `auto` settings became on
this machine (strategy, replicas, precision, XLA) and why. A run that
resumes in the same folder compares its configuration with the record and
names every key that changed, so that a resumed run is never silently a
different run.

`config.yaml` always describes the run that wrote the newest backup (the one
a rerun resumes from): a run replaces it only once it has written a backup of
its own, and a run whose backups are all discarded (a refused resume, a
diverged run) puts back the record of the run that wrote the backup that is
left. Every run that starts training also leaves an append-only entry in
`MODEL_DIR/runs/` (`001-20260101-120000.yaml`: who ran it, its options and
auto choices, the backups it wrote, and how it ended), so that no run's record
is ever lost.

Example:

    values = config_values(config, options)
    changes = changed_keys(read_record(model_dir), {"options": values, "resolved": resolved})
    write_record(model_dir, values, resolved)
"""

import os
import re
import time

import yaml

RECORD_FILE = "config.yaml"
HISTORY_DIR = "runs"
_ENTRY = re.compile(r"(\d+)-[0-9-]+\.yaml")


def config_values(config, options):
    """Every option's value, in the recipe's option order.

    Args:
        config: the parsed config namespace.
        options: the recipe's `Option` list.

    Example:

    >>> config_values(argparse.Namespace(epochs=3), [Option("epochs", int, 1, "...")])
    {'epochs': 3}
    """
    return {option.name: getattr(config, option.name) for option in options}


def render_record(values, resolved=None, config_file=None):
    """The YAML text of a record.

    Example:

    >>> print(render_record({"epochs": 3}, {"precision": "float32"}))
    options:
      epochs: 3
    resolved:
      precision: float32
    """
    record = {"options": dict(values)}
    if resolved:
        record["resolved"] = dict(resolved)
    if config_file:
        record["config_file"] = os.path.abspath(config_file)
    return yaml.safe_dump(record, sort_keys=False, default_flow_style=False)


def write_record(model_dir, values, resolved=None, config_file=None):
    """Writes `MODEL_DIR/config.yaml` atomically (a crash never leaves half a file).

    Returns:
        The path written.

    Example:

    >>> write_record("runs/a", {"epochs": 3}, {"precision": "float32"})
    'runs/a/config.yaml'
    """
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, RECORD_FILE)
    text = render_record(values, resolved, config_file)
    try:
        with open(path) as stream:
            if stream.read() == text:
                return path  # unchanged: left byte for byte as it is
    except OSError:
        pass
    partial = f"{path}.partial-{os.getpid()}"
    try:
        with open(partial, "w") as stream:
            stream.write(text)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)  # a failed write (disk full) leaves no half file behind
    return path


def read_record(model_dir):
    """The record in `model_dir` as a dict, or None when there is none or it is unreadable.

    Example:

    >>> read_record("runs/a")["options"]["epochs"]
    3
    """
    path = os.path.join(model_dir, RECORD_FILE)
    try:
        with open(path) as stream:
            record = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError):
        return None
    return record if isinstance(record, dict) else None


def changed_keys(old, new):
    """The keys whose values differ between two records, as `(key, old, new)`.

    Options are compared by name, resolved settings as `resolved.NAME`; a
    key missing on one side counts as changed.

    Example:

    >>> changed_keys({"options": {"epochs": 3, "seed": 1}},
    ...              {"options": {"epochs": 5, "seed": 1}})
    [('epochs', 3, 5)]
    """
    changes = []
    for section, prefix in (("options", ""), ("resolved", "resolved.")):
        before = (old or {}).get(section) or {}
        after = (new or {}).get(section) or {}
        for key in list(before) + [k for k in after if k not in before]:
            if before.get(key, "<unset>") != after.get(key, "<unset>"):
                changes.append((prefix + key, before.get(key, "<unset>"), after.get(key, "<unset>")))
    return changes


def describe_changes(changes):
    """One readable line for `changed_keys`'s result.

    Example:

    >>> describe_changes([("epochs", 3, 5)])
    'epochs: 3 -> 5'
    """
    return "; ".join(f"{key}: {before} -> {after}" for key, before, after in changes)


class RunHistory:
    """One run's append-only entry in `MODEL_DIR/runs/`.

    Written when the run starts training (who, options, auto choices), then
    only appended to: each backup the run writes, and at the end how it
    ended. A run killed with SIGKILL leaves an entry without an outcome.

    Attributes:
        path: the entry's file.
        record: `{"options": ..., "resolved": ..., "config_file": ...}`.
        backups: the backup names (`ckpt-N`) this run wrote.
        results: the final model metrics noted (`note_results`), or None.

    Example:

    >>> entry = RunHistory.start("runs/a", {"epochs": 3}, {"precision": "float32"},
    ...                          run={"pid": 7, "command": "python -m tfdist.recipes.cnn"})
    >>> entry.note_backup("runs/a/backup/ckpt-4"); entry.finish("finished", 0)
    """

    def __init__(self, path, record):
        self.path = path
        self.record = record
        self.backups = []
        self.finished = False
        self.results = None

    @classmethod
    def start(cls, model_dir, values, resolved=None, config_file=None, run=None):
        """Creates the next entry (`NNN-YYYYmmdd-HHMMSS.yaml`) and returns it.

        Example:

        >>> RunHistory.start("runs/a", {"epochs": 3}).path
        'runs/a/runs/001-20260101-120000.yaml'
        """
        folder = os.path.join(model_dir, HISTORY_DIR)
        os.makedirs(folder, exist_ok=True)
        record = yaml.safe_load(render_record(values, resolved, config_file))
        text = yaml.safe_dump({"run": dict(run or {})}, sort_keys=False,
                              default_flow_style=False) + render_record(values, resolved,
                                                                        config_file)
        number = max([int(m.group(1)) for m in map(_ENTRY.fullmatch, os.listdir(folder)) if m]
                     + [0]) + 1
        while True:
            path = os.path.join(folder, f"{number:03d}-{time.strftime('%Y%m%d-%H%M%S')}.yaml")
            try:
                with open(path, "x") as stream:
                    stream.write(text)
                return cls(path, record)
            except FileExistsError:
                number += 1

    def note_backup(self, path):
        """Appends a backup this run wrote (its `ckpt-N` name).

        Example:

        >>> entry.note_backup("runs/a/backup/ckpt-4")
        """
        name = os.path.basename(os.fspath(path))
        if not name or name in self.backups[-1:]:
            return
        self._append(("backups:\n" if not self.backups else "") + f"- {name}\n")
        self.backups.append(name)

    def note_results(self, metrics):
        """Appends the run's final model metrics (name -> number), once, after its
        last backup note (the runner calls it when `fit` has returned).

        Example:

        >>> entry.note_results({"loss": 0.31, "val_bleu": 41.2})
        """
        if not metrics or self.results is not None:
            return
        self.results = {name: round(float(value), 6) for name, value in metrics.items()}
        self._append(yaml.safe_dump({"results": self.results}, sort_keys=False,
                                    width=10**6))

    def finish(self, outcome, exit_code):
        """Appends how the run ended (once).

        Example:

        >>> entry.finish("stopped by SIGTERM", 143)
        """
        if self.finished:
            return
        self.finished = True
        self._append(yaml.safe_dump({"outcome": outcome, "exit_code": exit_code},
                                    sort_keys=False, width=10**6))

    def _append(self, text):
        with open(self.path, "a") as stream:
            stream.write(text)


def history_entries(model_dir):
    """The run entries of `model_dir`, oldest first, as dicts (unreadable ones skipped).

    Example:

    >>> [entry["outcome"] for entry in history_entries("runs/a")]
    ['finished', 'stopped by SIGTERM ...']
    """
    folder = os.path.join(model_dir, HISTORY_DIR)
    try:
        names = sorted((int(m.group(1)), m.group(0))
                       for m in map(_ENTRY.fullmatch, os.listdir(folder)) if m)
    except OSError:
        return []
    entries = []
    for _, name in names:
        try:
            with open(os.path.join(folder, name)) as stream:
                entry = yaml.safe_load(stream)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(entry, dict):
            entries.append(dict(entry, path=os.path.join(folder, name)))
    return entries


def writer_of_backup(model_dir, backup_path):
    """The history entry of the run that wrote the backup `backup_path`, or None.

    The newest entry that names the backup wins (backup numbers can be
    reused after a run's backups were discarded).

    Example:

    >>> writer_of_backup("runs/a", "runs/a/backup/ckpt-4")["options"]["epochs"]
    3
    """
    name = os.path.basename(os.fspath(backup_path))
    for entry in reversed(history_entries(model_dir)):
        if name in (entry.get("backups") or []):
            return entry
    return None


def settle_record(model_dir, backup_path):
    """Makes `config.yaml` the record of the run that wrote `backup_path` (the
    newest backup), when the history knows that run; otherwise leaves it.

    Returns:
        The history entry used, or None.

    Example:

    >>> settle_record("runs/a", latest_backup("runs/a/backup").path)["path"]
    'runs/a/runs/002-20260101-120500.yaml'
    """
    writer = writer_of_backup(model_dir, backup_path) if backup_path else None
    if writer is not None:
        write_record(model_dir, writer.get("options") or {}, writer.get("resolved"),
                     writer.get("config_file"))
    return writer
