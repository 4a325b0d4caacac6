"""Which backups a `DivergenceGuard` has seen to be healthy: the one rotation must keep."""

import dataclasses
import os

from tfdist.callbacks.backup.store import CHECKPOINT_NAME


@dataclasses.dataclass(frozen=True)
class _Written:
    number: int
    global_step: int
    health_step: int  # the guard's step count when the backup was taken


class GoodBackups:
    """Tracks the newest *good* backup: one whose weights a `DivergenceGuard`
    judged healthy at a later check (`LossHealth.confirmed`).

    The backup training resumed from counts as good from the start (it is
    where this run began). Backups written since are *pending* until the
    guard confirms them; the newest confirmed one becomes the good one.
    Everything is decided from what this process saw (never from the
    folder), so every worker of a multi-worker job decides the same.

    Args:
        health: the guard's `LossHealth`.
        backup_dir: the backup folder (for the good backup's path).
        max_to_keep: the rotation's `max_to_keep` (pending backups older
            than the last `max_to_keep` written are gone, unless good).
        restored: the `BackupInfo` training resumed from, or None.

    Example:

    >>> good = GoodBackups(health, "backup", max_to_keep=2, restored=backup.restored)
    >>> good.written(number=13, global_step=26)
    >>> good.update(), good.pending()
    (12, [13])
    """

    def __init__(self, health, backup_dir, max_to_keep, restored=None):
        self.health = health
        self.backup_dir = backup_dir
        self.max_to_keep = max_to_keep
        self.good = None
        if restored is not None:
            self.good = _Written(restored.number, restored.global_step, health.steps)
        self._pending = []
        self._written = []

    def written(self, number, global_step):
        """Records a backup just written (pending until confirmed).

        Example:

        >>> good.written(number=13, global_step=26)
        """
        self._pending.append(_Written(number, global_step, self.health.steps))
        self._written.append(number)

    def update(self):
        """Moves confirmed backups out of pending; returns the good backup's
        number, or None when there is none yet.

        Example:

        >>> good.update()
        12
        """
        confirmed = [w for w in self._pending if self.health.confirmed(w.health_step)]
        if confirmed:
            self.good = confirmed[-1]
            self._pending = [w for w in self._pending if w.number > self.good.number]
        return self.good.number if self.good is not None else None

    def pending(self):
        """Numbers of the backups written by this run, not confirmed yet and
        not rotated out (this run's numbers are the newest, so the rotation
        keeps the last `max_to_keep` of them, and the good one).

        Example:

        >>> good.pending()
        [13]
        """
        self.update()
        kept = set(self._written[-self.max_to_keep:])
        return [w.number for w in self._pending if w.number in kept]

    def good_path(self):
        """The good backup's checkpoint prefix, or None.

        Example:

        >>> good.good_path()
        'backup/ckpt-12'
        """
        if self.good is None:
            return None
        return os.path.join(self.backup_dir, f"{CHECKPOINT_NAME}-{self.good.number}")
