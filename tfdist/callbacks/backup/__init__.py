"""Step-level backups that survive a lost worker, resumed at the exact step.

    from tfdist.callbacks.backup import BackupAndResume

    trainer.fit(dataset, epochs=10,
                callbacks=[NanGuard(), BackupAndResume("backup", save_freq=200)])

`BackupAndResume` is the callback; `latest_backup`, `list_backups` and
`read_backup` inspect a backup folder without a model (e.g. to see where a
relaunched job will resume), and `describe_backup` names a backup for an
operator ("ckpt-7 (global step 120) in backup"). `BackupIndexError` (a
folder whose backups cannot be read) and `BackupWriteError` (a failed write,
e.g. a full disk) are the errors an operator must act on.
"""

from tfdist.callbacks.backup.callback import BackupAndResume, ResumeWarning
from tfdist.callbacks.backup.errors import BackupIndexError, BackupWriteError
from tfdist.callbacks.backup.index import latest_backup, list_backups
from tfdist.callbacks.backup.store import BackupInfo, describe_backup, read_backup
from tfdist.callbacks.backup.writer import BackupWriter

__all__ = ["BackupAndResume", "BackupIndexError", "BackupInfo", "BackupWriteError",
           "BackupWriter", "ResumeWarning", "describe_backup", "latest_backup", "list_backups",
           "read_backup"]
