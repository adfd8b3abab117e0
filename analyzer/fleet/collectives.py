"""The fleet's table of collective kernels (analyzer.views.collectives' columns as a pandas DataFrame), with each
kernel's `ordinal`: its position among its process group's collectives in its step (in the trace when it is in no
step), the same on every rank, since every rank issues a group's collectives in the same order. The job report
matches ranks' collectives by (pg, step, ordinal) or by seq."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.views.collectives import COLUMNS, collective_columns


def collective_table(ctx) -> pd.DataFrame:
    columns = collective_columns(ctx)
    if columns is None:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "pg") else
                                          (float if c.endswith("_us") else np.int64)) for c in COLUMNS})
    table = pd.DataFrame(columns)
    table.insert(6, "ordinal", table.groupby(["pg", "step"], sort=False).cumcount().astype(np.int64))
    return table
