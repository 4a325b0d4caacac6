"""Which part of a source one input pipeline reads.

Rule: shard by FILE when the source has at least as many files as there are
input pipelines (each pipeline reads whole files, no pipeline reads a file
twice); otherwise shard by RECORD (every pipeline reads the records in the
same fixed order and keeps every N-th one). Either way every record goes to
exactly one pipeline: nothing is duplicated across workers, nothing is lost.

Counts per pipeline can differ (uneven files, or record counts not divisible
by the number of pipelines). Training must therefore run on a repeated
dataset with a fixed `steps_per_epoch`, so that every worker takes the same
number of steps; a worker that runs out of data first would otherwise leave
the others blocked in an all-reduce.
"""

import dataclasses

FILE = "file"
RECORD = "record"
MODES = (FILE, RECORD)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The part of a source read by input pipeline `index` of `count`.

    Attributes:
        mode: `"file"` or `"record"`.
        index: this input pipeline's id, in `[0, count)`.
        count: number of input pipelines (usually one per worker).
        num_files: files in the whole source (0 for in-memory sources).
        files: the files this pipeline reads in file mode (empty when the
            source manages its own files, e.g. TFDS, or in record mode).

    Example:

    >>> plan_sharding(5, 2, 1, files=list("abcde"))
    ShardPlan(mode='file', index=1, count=2, num_files=5, files=('b', 'd'))
    """

    mode: str
    index: int
    count: int
    num_files: int
    files: tuple = ()

    def describe(self):
        """Returns a one-line, human-readable summary of the plan.

        Example:

        >>> plan_sharding(1, 2, 1).describe()
        'input pipeline 1 of 2: sharding by RECORD (1 file(s), 2 pipeline(s)): reads records 1, 3, 5, ...'
        """
        head = f"input pipeline {self.index} of {self.count}: sharding by {self.mode.upper()}"
        if self.mode == FILE:
            which = f"{len(self.files)} of {self.num_files} files" if self.files else (
                f"its share of {self.num_files} files")
            return f"{head} ({self.num_files} file(s) >= {self.count} pipeline(s)): reads {which}"
        which = ("all records" if self.count == 1 else
                 f"records {self.index}, {self.index + self.count}, {self.index + 2 * self.count}, ...")
        return f"{head} ({self.num_files} file(s), {self.count} pipeline(s)): reads {which}"


def plan_sharding(num_files, num_input_pipelines=1, input_pipeline_id=0, files=None):
    """Decides how input pipeline `input_pipeline_id` shards a source.

    Args:
        num_files: number of files the source is stored in (0 for in-memory).
        num_input_pipelines: total number of input pipelines, >= 1.
        input_pipeline_id: this pipeline's id, in `[0, num_input_pipelines)`.
        files: optional sequence of the source's file paths (same order in
            every worker); in file mode the plan lists the ones to read,
            `files[input_pipeline_id::num_input_pipelines]`.

    Returns:
        A `ShardPlan`.

    Raises:
        ValueError: a count or id is out of range, or `files` does not have
            `num_files` entries.

    Example:

    >>> plan_sharding(num_files=8, num_input_pipelines=2).mode
    'file'
    >>> plan_sharding(num_files=0, num_input_pipelines=2).mode
    'record'
    """
    for name, value in (("num_files", num_files), ("num_input_pipelines", num_input_pipelines),
                        ("input_pipeline_id", input_pipeline_id)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
    if num_input_pipelines < 1:
        raise ValueError(f"num_input_pipelines must be >= 1, got {num_input_pipelines}.")
    if input_pipeline_id >= num_input_pipelines:
        raise ValueError(f"input_pipeline_id must be in [0, {num_input_pipelines}), "
                         f"got {input_pipeline_id}.")
    if files is not None and len(files) != num_files:
        raise ValueError(f"files has {len(files)} entries but num_files is {num_files}.")
    if num_files >= num_input_pipelines and num_files > 0:
        mine = tuple(files[input_pipeline_id::num_input_pipelines]) if files else ()
        return ShardPlan(FILE, input_pipeline_id, num_input_pipelines, num_files, mine)
    return ShardPlan(RECORD, input_pipeline_id, num_input_pipelines, num_files)
