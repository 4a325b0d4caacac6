"""Step-level backups that survive a lost worker, resumed at the exact step.

    from tfdist.callbacks.backup import BackupAndResume

    trainer.fit(dataset, epochs=10,
                callbacks=[NanGuard(), BackupAndResume("backup", save_freq=200)])

`BackupAndResume` is the callback; `latest_backup`, `list_backups` and
`read_backup` inspect a backup folder without a model (e.g. to see where a
relaunched job will resume).
"""

from tfdist.callbacks.backup.callback import BackupAndResume, ResumeWarning
from tfdist.callbacks.backup.store import (BackupInfo, BackupWriter, latest_backup,
                                           list_backups, read_backup)

__all__ = ["BackupAndResume", "BackupInfo", "BackupWriter", "ResumeWarning", "latest_backup",
           "list_backups", "read_backup"]
