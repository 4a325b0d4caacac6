"""MkDocs hook: autorefs' complaints about docstring text are not broken links.

The docstrings' examples print lists and index arrays (`x[0]`, `['a', 'b']`),
which Markdown reads as reference links; mkdocs-autorefs then warns that it
cannot find their "targets" and the strict build fails. This hook drops those
warnings only when they come from a docstring (autorefs names the source file,
`from PATH.py:LINE:`). A broken link written in a page of docs/ is still a
warning, and so an error under `mkdocs build --strict`.
"""

import logging
import re

FROM_DOCSTRING = re.compile(r"from \S+\.py:\d+: .*Could not find cross-reference target")


class _DropDocstringRefs(logging.Filter):
    def filter(self, record):
        return not FROM_DOCSTRING.search(record.getMessage())


def on_startup(command, dirty):
    """Installs the filter on autorefs' loggers (MkDocs calls this once, plugins loaded)."""
    names = [name for name in logging.root.manager.loggerDict
             if name.startswith("mkdocs.plugins.mkdocs_autorefs")]
    if not names:
        raise RuntimeError("docs/hooks/docstring_refs.py found no mkdocs_autorefs logger: "
                           "mkdocs-autorefs changed its logger names; update this hook.")
    for name in names:
        logging.getLogger(name).addFilter(_DropDocstringRefs())
