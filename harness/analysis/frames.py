"""Result rows as the fits see them: which rows, which groups, one aggregated point per x.

The DataFrame side of the analysis: derived variables (``window``, ``d_model``,
``document_len``), the ok rows of a metric, the point fields that tell fits apart, and the
aggregation of duplicate rows into one point per (group, x) with the raw samples (per timing
pass) and the interval-derived uncertainty that :mod:`harness.analysis.fits` feeds to the fit.

Optional columns are read through :func:`column`: a row set without one (``document_len`` in a
run without packed documents, ``host_frac`` off CUDA) reads the schema's declared default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np
import pandas as pd

from harness import scenarios
from harness.measure.passes import point_estimate, split_samples
from harness.scenarios import interface, packing
from harness.scenarios.interface import FIELD_DEFAULTS
from harness.schema import COLUMNS, POINT_COLUMNS

SHAPE_FIELDS = ("heads", "head_dim", "d_model")
SHAPE_PARTNER = {"heads": "d_model", "head_dim": "d_model", "d_model": "head_dim"}
KEY_FIELDS: tuple[str, ...] = (*POINT_COLUMNS, "d_model")
# point fields the implementation sets (Column.follows_impl): rows of two implementations are
# matched without them
IMPL_FIELDS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.point and c.follows_impl)
# derived columns -> the point fields they are made from (Column.moves_with)
MOVES_WITH: dict[str, set[str]] = {c.name: set(c.moves_with) for c in COLUMNS if c.moves_with}
# metric -> power of time it scales with; their bootstrap resamples time_samples_s (the core
# columns, and the columns a scenario declares with a Column.time_power: bw_fraction)
TIME_METRICS = {"time_median_s": 1.0, "tokens_per_s": -1.0, "tflops_per_s": -1.0} | {
    c.name: c.time_power for c in scenarios.declared_columns() if c.time_power
}
MISSING = "-"  # group-key stand-in for None/NaN (pandas cannot group or merge on them reliably)


def column(df: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` of the rows, read through the schema: as written where the rows carry
    it; where they do not (an optional column: ``document_len`` without packed documents,
    ``host_frac`` off CUDA, a field added after the rows were written), its declared default
    on every row: the Point field's default for a point field, a scenario setting's default on
    the rows of the scenarios that have it (also where such a row has null), null for anything
    else."""
    owners = setting_defaults().get(name, {})
    if name in df.columns:
        cells = df[name]
        if owners and "scenario" in df.columns:  # rows written before the setting existed
            default = df["scenario"].map(owners)
            cells = cells.where(cells.notna() | default.isna(), default)
        return cells
    if owners and "scenario" in df.columns:
        return df["scenario"].map(owners).astype(object)
    return pd.Series([FIELD_DEFAULTS.get(name)] * len(df), index=df.index, dtype=object)


@lru_cache(maxsize=1)
def setting_defaults() -> dict[str, dict[str, object]]:
    """setting -> {scenario word: its default}: what a row of that scenario written before the
    setting existed meant (decode's ``step`` is ``block`` on rows older than it)."""
    out: dict[str, dict[str, object]] = {}
    for word in interface.names():
        for f in dataclasses.fields(interface.get(word).settings):
            if f.default is not dataclasses.MISSING and f.default is not None:
                out.setdefault(f.name, {})[word] = f.default
    return out


DERIVED = "attnbench.derived"  # DataFrame.attrs flag: with_derived made this frame


def with_derived(df: pd.DataFrame) -> pd.DataFrame:
    """Add derived variables one may fit against: ``window`` = keys per query (left+right+1);
    ``document_len`` (the token-weighted mean document length) where rows written before that
    column carry only ``document_lengths``.

    A frame this returned, or rows selected from it (pandas carries ``attrs`` to them), comes
    back as a plain copy: deriving again gives the same columns, and judging the bundled
    claims derived the same rows 146 times (a sixth of the judging time)."""
    if df.attrs.get(DERIVED):
        return df.copy()
    out = df.copy()
    out.attrs[DERIVED] = True
    if "document_lengths" in out.columns:
        derived = out["document_lengths"].map(
            lambda v: packing.document_len(tuple(v)) if isinstance(v, list) and v else np.nan
        )
        given = pd.to_numeric(out.get("document_len", derived), errors="coerce")
        out["document_len"] = given.fillna(derived)
    if "window_left" in out.columns and "window_right" in out.columns:
        left = pd.to_numeric(out["window_left"], errors="coerce")
        right = pd.to_numeric(out["window_right"], errors="coerce")
        out["window"] = (left.fillna(0) + right.fillna(0) + 1).where(left.notna() | right.notna())
    if "d_model" not in out.columns and {"heads", "head_dim"} <= set(out.columns):
        out["d_model"] = out["heads"] * out["head_dim"]
    return out


def covarying(over: str, hold: Sequence[str] = ()) -> set[str]:
    """Fields that change with ``over`` by construction (d_model = heads·head_dim) or derivation."""
    out = {"point_id", "q_len"} if over == "seq_len" else {"point_id"}
    if over == "window":
        out |= {"window_left", "window_right"}
    if over in {"window_left", "window_right"}:
        out.add("window")
    if over == "document_len":  # the documents spec is what moves it
        out.add("documents")
    out |= MOVES_WITH.get(over, set())
    if over in SHAPE_FIELDS:  # d_model = heads·head_dim: the shape field not held co-varies
        free = [f for f in SHAPE_FIELDS if f != over and f not in hold]
        out |= {SHAPE_PARTNER[over]} if len(free) == 2 else set(free)
    return out


def group_keys(
    df: pd.DataFrame, over: str, hold: Sequence[str] = (), covary: Sequence[str] | None = None
) -> list[str]:
    """Point fields that tell fits apart: those that vary in ``df`` (plus ``hold``), minus ``over``
    and the fields that co-vary with it; ``impl`` is always kept (it labels the fit)."""
    skip = covarying(over, hold) if covary is None else set(covary)
    keys = []
    for c in (*KEY_FIELDS, "window"):
        if c not in df.columns or c == over or c in skip or c in keys:
            continue
        if c == "impl" or c in hold or _distinct(df[c]) > 1:
            keys.append(c)
    return keys


def groupable(df: pd.DataFrame) -> pd.DataFrame:
    """Key columns with None/NaN replaced by :data:`MISSING`, so groupby and merge see them."""
    return pd.DataFrame(
        {c: _key_values(df[c]) for c in df.columns}, index=df.index, columns=df.columns
    )


def _key_values(cells: pd.Series) -> np.ndarray:
    """One column of :func:`groupable`: its values as Python objects, None/NaN as
    :data:`MISSING`. Column by column in NumPy: ``astype(object).where(notna(), MISSING)`` on
    the frame cost 0.7 ms a call, and the judging of one claim made dozens."""
    values = cells.to_numpy(dtype=object, copy=True)
    values[pd.isna(values)] = MISSING
    return values


def _distinct(cells: pd.Series) -> int:
    """How many values a key column holds, None/NaN counted as one (as :func:`groupable`
    makes them)."""
    return len(set(_key_values(cells).tolist()))


def select(df: pd.DataFrame, metric: str, where: dict | None = None) -> pd.DataFrame:
    """Rows with status ok, a positive finite ``metric`` and ``column == value`` for ``where``."""
    if metric not in df.columns:
        return df.iloc[0:0]
    keep = pd.to_numeric(df[metric], errors="coerce").gt(0)
    if "status" in df.columns:
        keep &= df["status"].eq("ok")
    for col, value in (where or {}).items():
        keep &= matches(df, col, value)
    return df[keep]


def matches(df: pd.DataFrame, col: str, value: object) -> pd.Series:
    """Rows whose ``col`` (read through :func:`column`) equals ``value`` (None: null)."""
    return pd.Series(match_mask(df, col, value), index=df.index, dtype=bool)


def match_mask(df: pd.DataFrame, col: str, value: object) -> np.ndarray:
    """:func:`matches` as a NumPy bool array (for masks anded before one selection)."""
    target = MISSING if value is None else value
    return np.array([cell == target for cell in _key_values(column(df, col))], dtype=bool)


def _ci_sigma(df: pd.DataFrame) -> pd.Series:
    """Standard error of log(time) from each row's stored 95 % median interval (NaN if none)."""
    if not {"time_ci_low_s", "time_ci_high_s"} <= set(df.columns):
        return pd.Series(np.nan, index=df.index)
    lo = pd.to_numeric(df["time_ci_low_s"], errors="coerce")
    hi = pd.to_numeric(df["time_ci_high_s"], errors="coerce")
    with np.errstate(all="ignore"):
        return (np.log(hi) - np.log(lo)) / (2 * 1.96)


def _pass_samples(df: pd.DataFrame) -> pd.Series | None:
    """Each row's ``time_samples_s`` (seconds) cut into its timing passes (``pass_samples``): a
    list of per-pass lists, one pass when the row has no pass counts; None without samples."""
    if "time_samples_s" not in df.columns:
        return None
    counts = df["pass_samples"] if "pass_samples" in df.columns else pd.Series(None, df.index)

    def split(samples, count) -> list | None:
        if not isinstance(samples, list):
            return None
        count = count if isinstance(count, list) else None
        return [g.tolist() for g in split_samples(samples, count)]

    pairs = zip(df["time_samples_s"], counts, strict=True)
    return pd.Series([split(s, c) for s, c in pairs], df.index)


def normalized_time(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with their time in the ``normalized`` basis (claims.py ``time_basis``): the
    samples of each timing pass divided by the reference kernel's time in that pass
    (``pass_ref_kernel_s``, :mod:`harness.measure.refkernel`) and multiplied by the median of
    every row's reference times on that device (one scale for all the rows: seconds again, at
    the run's typical machine speed, so ratios between rows and utilization keep their
    meaning); ``time_median_s`` is their median of pass medians. A machine whose speed shifts
    between passes (another tenant on the core's sibling) moves a pass's samples and its
    reference alike, and the shift cancels. A row without a reference time for each of its
    passes gets no time (NaN), so it is left out rather than mixed in unscaled. Rows already
    normalized (``attrs["time_basis"]``) come back as they are: claims judged one after
    another over the same rows normalize them once."""
    if df.attrs.get("time_basis") == "normalized":
        return df
    per_pass = _pass_samples(df) if "pass_ref_kernel_s" in df.columns else None
    if not len(df) or per_pass is None:
        out = df.assign(time_median_s=np.nan)
    else:
        refs = [ref if isinstance(ref, list) and len(ref) == len(passes or ())
                and all(isinstance(r, int | float) and r > 0 for r in ref) else None
                for ref, passes in zip(df["pass_ref_kernel_s"], per_pass, strict=True)]
        devices = column(df, "device").tolist()
        pooled: dict = {}
        for ref, dev in zip(refs, devices, strict=True):
            pooled.setdefault(dev, []).extend(ref or [])
        scale = {dev: np.median(r) if r else np.nan for dev, r in pooled.items()}
        times, samples, counts = [], [], []
        for passes, ref, dev in zip(per_pass, refs, devices, strict=True):
            scaled = [np.asarray(g, float) * (scale[dev] / r)
                      for g, r in zip(passes, ref, strict=True) if len(g)] if ref else []
            times.append(point_estimate(scaled) if scaled else np.nan)
            samples.append([x for g in scaled for x in g.tolist()] if scaled else None)
            counts.append([g.size for g in scaled] if scaled else None)
        out = df.assign(time_median_s=times, time_samples_s=samples, pass_samples=counts)
    out.attrs["time_basis"] = "normalized"
    return out


def aggregate(df: pd.DataFrame, over: str, metric: str, keys: Sequence[str]) -> pd.DataFrame:
    """One row per (keys, over): the ``keys``, ``x`` (the value of ``over``), ``y`` (median
    ``metric``), ``samples`` (per-pass sample lists of every duplicate row, pooled; None when a
    row has none), ``sigma`` (median standard error of log y from the stored intervals, NaN
    when unknown) and ``rows`` (how many rows were merged)."""
    frame = (
        groupable(df[list(keys)])
        .assign(
            x=pd.to_numeric(column(df, over), errors="coerce"),
            y=pd.to_numeric(column(df, metric), errors="coerce"),
            samples=_pass_samples(df),
            sigma=_ci_sigma(df) if metric in TIME_METRICS else np.nan,
        )
        .dropna(subset=["x", "y"])
    )
    frame = frame[frame["x"] > 0]

    grouped = frame.groupby([*keys, "x"], sort=True, dropna=False)
    # pandas' own reductions per column: a named .agg() with a Python function took 20-30 ms
    out = grouped["y"].median().to_frame()
    out["samples"] = pd.Series(_pool(frame["samples"], grouped.ngroup(), len(out)),
                               index=out.index, dtype=object)
    out["sigma"] = grouped["sigma"].median()
    out["rows"] = grouped.size()
    return out.reset_index()


def _pool(samples: pd.Series, group: pd.Series, count: int) -> list:
    """Per group (numbered as ``group`` numbers the rows), the per-pass sample lists of its
    rows side by side (duplicate runs), in row order; None where a row has none."""
    pooled: list[list | None] = [[] for _ in range(count)]
    for g, lists in zip(group.to_numpy(), samples.tolist(), strict=True):
        if not isinstance(lists, list):
            pooled[g] = None
        elif pooled[g] is not None:
            pooled[g] += lists
    return pooled


def iter_groups(agg: pd.DataFrame, keys: Sequence[str]) -> Iterator[tuple[dict, pd.DataFrame]]:
    """(``{key: value}``, the group's rows sorted by ``x``) for each group of ``keys`` in an
    aggregated frame (:func:`aggregate`); one group of every row when ``keys`` is empty."""
    if not keys:
        yield {}, agg.sort_values("x")
        return
    for values, part in agg.groupby(list(keys), sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        yield dict(zip(keys, values, strict=True)), part.sort_values("x")


def group_label(values: dict) -> str:
    """A fitted group in words, e.g. ``causal=True, heads=8`` (``impl`` left out)."""
    def word(v: object) -> object:  # a whole float (a column with nulls beside) as an int
        return int(v) if isinstance(v, float) and v.is_integer() else v

    return ", ".join(f"{k}={word(v)}" for k, v in values.items() if k != "impl") or "all rows"
