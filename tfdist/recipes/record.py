"""The record a run leaves in its model directory: the configuration it used.

`MODEL_DIR/config.yaml` holds every option's value (after the `--config`
file and the flags) and, under `resolved`, what the `auto` settings became on
this machine (strategy, replicas, precision, XLA) and why. A run that
resumes in the same folder compares its configuration with the record and
names every key that changed, so that a resumed run is never silently a
different run.

Example:

    values = config_values(config, options)
    changes = changed_keys(read_record(model_dir), {"options": values, "resolved": resolved})
    write_record(model_dir, values, resolved)
"""

import os

import yaml

RECORD_FILE = "config.yaml"


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
    partial = f"{path}.partial-{os.getpid()}"
    with open(partial, "w") as stream:
        stream.write(render_record(values, resolved, config_file))
    os.replace(partial, path)
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
