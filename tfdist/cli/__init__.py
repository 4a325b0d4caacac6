"""tfdist.cli: the `tfdist` command's own tools (`tfdist doctor`).

    python -m tfdist.cli.doctor
"""
