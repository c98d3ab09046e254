"""Rolling, partitioned Parquet writer: buffers per partition, writes large row groups.

Incoming tables are small per partition (one chunk of input split across partitions), so
writing each as a row group would produce thousands of tiny row groups. Instead every
partition buffers its rows and writes them as one row group once it holds `row_group_bytes`.

Buffering is by *segment*: each table handed in (for the plain path, a whole chunk already
grouped by partition) is kept once, and partitions hold row ranges of it. A thousand-way
split therefore costs one Arrow table, not a thousand small copies, each with its own
Python and C++ objects (at 10,000 partitions those objects, not the data, had taken most of
a gigabyte). A segment's memory is freed when the last partition holding rows of it has
written them. The live segments are capped by `buffer_limit_bytes`: past it, the partitions
holding rows of the oldest segments are written out until the total is under half the
limit, so at most the limit plus one incoming table is ever buffered.

Every open file costs memory of its own: its output stream's buffer (opened small here,
`STREAM_BUFFER_BYTES`; pyiceberg's default of 1 MiB per stream had made 100 open files
about 120 MB) and the Parquet writer's state. `max_open_files` caps how many stay open:
opening one more closes the least recently written file early, trading smaller files for
bounded memory. `held_bytes` counts both the buffered segments and the open files.

Parquet encoding (the expensive part) runs in one background thread per writer, with at most
one row group in flight: a Spark task spends most of its time waiting for the JVM's next
Arrow batches, and the encoding of the previous row group overlaps that wait.

Files roll at `target_file_size` (measured by the output stream position). Because a row
group's compressed size is only known after writing it, the writer estimates the file's
compression ratio (bytes written / Arrow bytes written) and caps each row group at the rows
expected to fill the rest of the target, so small targets are not overshot by one big row
group.
"""

from __future__ import annotations

import errno
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO, OutputStream
from pyiceberg.schema import Schema

from lakesink_datasource.iceberg.partition_key import PartitionKey
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.io.bloom_filters import bloom_filter_options
from lakesink_datasource.io.metrics import add_counts, count_nans, data_file_message
from lakesink_datasource.io.row_order import RowOrder
from lakesink_datasource.messages import DataFileMessage

logger = logging.getLogger(__name__)

MiB = 1024 * 1024

# Output streams are opened with this buffer. Parquet hands the stream whole pages (about a
# MiB each), so a small buffer costs no throughput and keeps each open file cheap.
STREAM_BUFFER_BYTES = 64 * 1024
# What one open file holds besides its stream buffer (the Parquet writer's state, measured at
# about 45 KiB for a few columns): counted in `held_bytes`.
_OPEN_FILE_STATE_BYTES = 64 * 1024
# A file whose remaining room is below this fraction of the target is closed rather than
# topped up with a sliver of a row group (estimates rarely land exactly on the target).
_TAIL_FRACTION = 0.125
# Before any file has been written, assume Parquet is as large as Arrow: the first row group
# then cannot overshoot the target, and later ones use the observed ratio.
_INITIAL_RATIO = 1.0
# A table handed to write() that pins more than this many times its own bytes (e.g. a small
# slice of a large batch) is copied, so buffering it does not keep the whole batch alive.
_PINNED_SLACK = 2


@dataclass(frozen=True)
class WriterStats:
    rows_written: int  # rows in files (written row groups), not rows still buffered
    bytes_written: int  # bytes in files, open ones included
    files_written: int  # files opened so far


@dataclass
class _OpenFile:
    path: str
    stream: OutputStream
    writer: pq.ParquetWriter
    rows: int = 0
    nan_counts: dict[int, int] = field(default_factory=dict)
    # Written by the encoder thread once a row group is in the file; read by the writer's
    # thread for estimates only (a stale value errs by at most the row group in flight).
    position: int = 0  # bytes in the file after its last encoded row group
    encoded_arrow_bytes: int = 0  # Arrow bytes of the row groups encoded so far
    pending_arrow_bytes: int = 0  # Arrow bytes handed to the encoder, not encoded yet

    def ratio(self) -> float | None:
        """Parquet bytes per Arrow byte seen so far in this file."""
        return self.position / self.encoded_arrow_bytes if self.encoded_arrow_bytes else None


class _Encoder:
    """One background thread that encodes row groups, at most one at a time in flight."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: Future[None] | None = None

    def submit(self, job: Callable[[], None]) -> None:
        self.wait()  # bounds memory: the next row group waits for the previous one
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakesink-parquet")
        self._inflight = self._pool.submit(job)

    def wait(self) -> None:
        """Wait for the row group in flight; its error, if any, is raised here."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def shutdown(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


@dataclass(eq=False)
class _Segment:
    """One buffered table; partitions hold row ranges of it until they write them."""

    table: pa.Table
    nbytes: int
    bytes_per_row: float
    holders: set[PartitionKey] = field(default_factory=set)  # partitions with unwritten rows in it


@dataclass
class _Partition:
    key: PartitionKey
    pieces: list[tuple[_Segment, int, int]] = field(default_factory=list)  # (segment, first row, rows)
    buffered_bytes: float = 0.0  # its share of the segments' bytes (rows x bytes per row)
    assigned_rows: int = 0  # rows assigned to that file (written + buffered)
    path: str | None = None  # that file's location, named once per file
    file: _OpenFile | None = None
    last_row: pa.Table | None = None  # the file's last row so far, for runs sorted on arrival


@dataclass(frozen=True)
class Placement:
    """Where a run of input rows lands: rows [offset, offset+rows) of the table given to
    write() are rows [position, position+rows) of the data file at `path`."""

    path: str
    position: int
    offset: int
    rows: int


class PartitionedParquetWriter:
    """Writes partitioned Arrow tables to rolling Parquet files and describes them.

    Rows get their final (file, position) when they are handed in, not when they are
    flushed: keyed writes record those locations in the key index and in deletion vectors
    while the rows are still buffered. File rolling is therefore decided when rows arrive,
    from the estimated size of what is assigned to the current file.
    """

    @classmethod
    def for_table(
        cls,
        settings: TableSettings,
        *,
        io: FileIO,
        iceberg_schema: Schema,
        arrow_schema: pa.Schema,
        spec_id: int,
        table_properties: dict[str, str],
        path_for: Callable[[PartitionKey, int], str],
        target_file_size: int | None = None,
        max_open_files: int | None = None,
        row_order: RowOrder | None = None,
        sort_on_arrival: bool = False,
    ) -> PartitionedParquetWriter:
        """A writer laid out by the table's Parquet properties (row group size, codec and
        level, page and dictionary sizes), rolling files at `target_file_size` or else the
        table's target."""
        return cls(
            io=io,
            iceberg_schema=iceberg_schema,
            arrow_schema=arrow_schema,
            spec_id=spec_id,
            table_properties=table_properties,
            path_for=path_for,
            target_file_size=target_file_size or settings.target_file_size_bytes,
            row_group_bytes=settings.parquet_row_group_bytes,
            compression=settings.parquet_compression,
            compression_level=settings.parquet_compression_level,
            page_bytes=settings.parquet_page_bytes,
            dictionary_bytes=settings.parquet_dictionary_bytes,
            max_open_files=max_open_files,
            bloom_filters=settings.bloom_filters,
            bloom_filter_max_bytes=settings.bloom_filter_max_bytes,
            row_order=row_order,
            sort_on_arrival=sort_on_arrival,
        )

    def __init__(
        self,
        *,
        io: FileIO,
        iceberg_schema: Schema,
        arrow_schema: pa.Schema,
        spec_id: int,
        table_properties: dict[str, str],
        path_for: Callable[[PartitionKey, int], str],
        target_file_size: int = 512 * MiB,
        row_group_bytes: int = 64 * MiB,
        buffer_limit_bytes: int = 256 * MiB,
        compression: str = "zstd",
        compression_level: int | None = None,
        page_bytes: int = 1024 * 1024,
        dictionary_bytes: int = 256 * 1024,
        max_open_files: int | None = None,
        bloom_filters: Mapping[str, float] | None = None,
        bloom_filter_max_bytes: int = 1024 * 1024,
        row_order: RowOrder | None = None,
        sort_on_arrival: bool = False,
    ) -> None:
        """`row_order`: every file is one run sorted by the table's sort order (its manifest
        entry names the order). By default a partition's buffer is sorted when it is flushed,
        then written whole and the file closed; rows' positions are then only known once
        flushed. With `sort_on_arrival` (for callers that record placements as rows arrive:
        keyed writes) rows come in through `write_sorted`, each call sorted as it arrives and
        appended to the partition's file when it continues the file's run, else given a new
        file."""
        if min(target_file_size, row_group_bytes, buffer_limit_bytes) <= 0:
            raise ValueError("target_file_size, row_group_bytes and buffer_limit_bytes must be positive")
        if max_open_files is not None and max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        self._io = io
        self._iceberg_schema = iceberg_schema
        self._arrow_schema = arrow_schema
        self._spec_id = spec_id
        self._table_properties = dict(table_properties)
        self._path_for = path_for
        self._target = target_file_size
        self._row_group_bytes = row_group_bytes
        # A sorted file is written whole when its buffer fills: up to half the writer's
        # buffer, so a table with small row groups gets several per file, each covering its
        # own range of the sort key (what min/max pruning skips by).
        sorts_at_flush = row_order is not None and not sort_on_arrival
        self._flush_bytes = max(row_group_bytes, buffer_limit_bytes // 2) if sorts_at_flush else row_group_bytes
        self._buffer_limit = buffer_limit_bytes
        self._compression = compression
        self._compression_level = compression_level
        self._page_bytes = page_bytes
        self._dictionary_bytes = dictionary_bytes
        self._max_open_files = max_open_files
        self._bloom_filters = bloom_filter_options(bloom_filters or {}, bloom_filter_max_bytes, arrow_schema)
        if sort_on_arrival and row_order is None:
            raise ValueError("sort_on_arrival needs a row_order")
        self._row_order = row_order
        self._sort_on_arrival = sort_on_arrival
        self._sorting_columns = row_order.sorting_columns(arrow_schema) if row_order is not None else None

        self._partitions: dict[PartitionKey, _Partition] = {}
        # Partitions with an open file, least recently written first (for max_open_files).
        self._open: OrderedDict[PartitionKey, None] = OrderedDict()
        # Segments with unwritten rows, oldest first; their bytes are what is buffered.
        self._segments: OrderedDict[int, _Segment] = OrderedDict()
        self._buffered_bytes = 0
        self.peak_buffered_bytes = 0  # high-water mark of buffered Arrow bytes, for tests/metrics
        self.peak_held_bytes = 0  # the same, with the open files' own memory counted
        self._ratio_hint = _INITIAL_RATIO  # last observed compression ratio, seeds new files
        self._paths: list[str] = []  # every file created, for abort()
        self._files_named = 0
        self._messages: list[DataFileMessage] = []
        self._closed_rows = 0
        self._closed_bytes = 0
        self._encoder = _Encoder()
        self._done = False

    @property
    def stats(self) -> WriterStats:
        open_files = [p.file for p in self._partitions.values() if p.file is not None]
        return WriterStats(
            rows_written=self._closed_rows + sum(f.rows for f in open_files),
            bytes_written=self._closed_bytes + sum(f.position for f in open_files),
            files_written=len(self._paths),
        )

    @property
    def buffered_bytes(self) -> int:
        return self._buffered_bytes

    @property
    def held_bytes(self) -> int:
        """Buffered rows plus what the open files hold (stream buffers, writer state)."""
        return self._buffered_bytes + len(self._open) * (STREAM_BUFFER_BYTES + _OPEN_FILE_STATE_BYTES)

    @property
    def open_files(self) -> int:
        return len(self._open)

    @property
    def sorts_on_arrival(self) -> bool:
        """Rows must come in through `write_sorted` (the files are sorted runs)."""
        return self._sort_on_arrival

    # -- handing rows in ------------------------------------------------------------------

    def write(self, key: PartitionKey, table: pa.Table, flush: bool = True) -> list[Placement]:
        """Assign rows of one partition to files and buffer them; returns where they land.

        With flush=False full buffers are not written yet (call flush_pending() later): a
        keyed write assigns rows while holding the host's index lock and encodes Parquet
        after releasing it.
        """
        self._check_open()
        if self._sort_on_arrival:
            raise RuntimeError("this writer sorts rows as they arrive: hand them in with write_sorted")
        if table.num_rows == 0:
            return []
        segment = self._segment(_unpin(self._conform(table)))
        placements = self._assign(key, segment, 0, table.num_rows)
        self._after_buffering(flush)
        return placements

    def write_sorted(self, key: PartitionKey, table: pa.Table, flush: bool = True) -> tuple[np.ndarray, list[Placement]]:
        """Sort rows of one partition by the row order and assign them to files as one run;
        returns the order (row i of the run is row order[i] of `table`) and where the run's
        rows land (offsets into the run).

        The run goes on the partition's current file when its first row sorts at or after
        the file's last row (a stream whose sort key grows fills files as an unsorted table
        would); otherwise the file ends and the run starts a new one.
        """
        self._check_open()
        order = self._row_order
        if order is None or not self._sort_on_arrival:
            raise RuntimeError("write_sorted needs a writer made with sort_on_arrival")
        if table.num_rows == 0:
            return np.zeros(0, dtype=np.int64), []
        indices = order.indices(table)
        run = self._conform(table).take(indices)  # a copy: pins nothing of the input
        part = self._partitions.get(key)
        if part is not None and part.assigned_rows and part.last_row is not None and not order.follows(part.last_row, run.slice(0, 1)):
            self._roll(part)
        placements = self._assign(key, self._segment(run), 0, run.num_rows)
        # A copy of one row: a slice would keep the whole run alive after it is written.
        self._partitions[key].last_row = run.take(pa.array([run.num_rows - 1]))
        self._after_buffering(flush)
        return indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), placements

    def write_groups(self, table: pa.Table, groups: list[tuple[PartitionKey, int, int]]) -> None:
        """Buffer a table whose rows are grouped by partition: `groups` lists each partition's
        (key, first row, rows). The table is kept once; partitions hold ranges of it."""
        self._check_open()
        if self._sort_on_arrival:
            raise RuntimeError("this writer sorts rows as they arrive: hand them in with write_sorted")
        if table.num_rows == 0:
            return
        segment = self._segment(self._conform(table))
        for key, start, rows in groups:
            if rows:
                self._assign(key, segment, start, rows)
        self._after_buffering(flush=True)

    def flush_pending(self) -> None:
        """Do the row-group writes that write(..., flush=False) deferred."""
        for part in list(self._partitions.values()):
            if part.buffered_bytes >= self._flush_bytes:
                self._flush(part)
        self._relieve_memory_pressure()

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError("writer is closed")

    def _conform(self, table: pa.Table) -> pa.Table:
        return table if table.schema.equals(self._arrow_schema) else table.cast(self._arrow_schema)

    def _segment(self, table: pa.Table) -> _Segment:
        segment = _Segment(table, table.nbytes, max(table.nbytes / table.num_rows, 1e-9))
        self._segments[id(segment)] = segment
        self._buffered_bytes += segment.nbytes
        self.peak_buffered_bytes = max(self.peak_buffered_bytes, self._buffered_bytes)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        return segment

    def _assign(self, key: PartitionKey, segment: _Segment, start: int, rows: int) -> list[Placement]:
        """Give rows [start, start+rows) of `segment` to partition `key`, rolling files at the
        target size; the rows stay buffered."""
        part = self._partitions.get(key)
        if part is None:
            part = self._partitions[key] = _Partition(key)
        placements = []
        offset = 0
        while offset < rows:
            room = self._room(part, segment.bytes_per_row)
            if room <= 0 and part.pieces:
                # The estimate says full, but buffered rows are only an estimate: write them
                # and decide from the real file size (at most one extra row group per file).
                self._flush(part)
                room = self._room(part, segment.bytes_per_row)
            if room <= 0 and part.file is not None and part.file.pending_arrow_bytes:
                self._encoder.wait()  # the same for the row group still being encoded
                room = self._room(part, segment.bytes_per_row)
            if room <= 0:
                self._roll(part)
                continue
            take = min(room, rows - offset)
            placements.append(Placement(self._current_path(part), part.assigned_rows, offset, take))
            part.assigned_rows += take
            part.pieces.append((segment, start + offset, take))
            part.buffered_bytes += take * segment.bytes_per_row
            segment.holders.add(key)
            offset += take
        return placements

    def _after_buffering(self, flush: bool) -> None:
        if not flush:
            return
        for part in list(self._partitions.values()):
            if part.buffered_bytes >= self._flush_bytes:
                self._flush(part)
        self._relieve_memory_pressure()
        self._release_unheld()

    def _room(self, part: _Partition, bytes_per_row: float) -> int:
        """Rows that still fit the current file, from the compression ratio seen so far.

        A file with rows is considered full once less than _TAIL_FRACTION of the target is
        left (estimates rarely land exactly on it); an empty file always takes rows.
        """
        ratio = max((part.file.ratio() if part.file else None) or self._ratio_hint, 1e-6)
        on_disk = part.file.position + part.file.pending_arrow_bytes * ratio if part.file else 0
        estimated = on_disk + part.buffered_bytes * ratio
        remaining = self._target - estimated
        if part.assigned_rows > 0 and remaining < self._target * _TAIL_FRACTION:
            return 0
        return max(1, math.ceil(max(remaining, 1) / (ratio * bytes_per_row)))

    def _current_path(self, part: _Partition) -> str:
        if part.path is None:
            # Numbered across the writer's partitions, not within each: a file's name alone
            # is unique (the object-store layout may leave the partition out of the path).
            part.path = self._path_for(part.key, self._files_named)
            self._files_named += 1
        return part.path

    def _roll(self, part: _Partition) -> None:
        """Finish the partition's current file; later rows go to the next one."""
        self._flush(part)
        if part.file is not None:
            self._close_file(part)
        part.assigned_rows = 0
        part.path = None
        part.last_row = None

    # -- finishing ------------------------------------------------------------------------

    def close(self) -> list[DataFileMessage]:
        """Write every buffer, close every file and return one message per file."""
        if self._done:
            return list(self._messages)
        for part in self._partitions.values():
            self._flush(part)
            if part.file is not None:
                self._close_file(part)
        self._encoder.shutdown()
        self._done = True
        self._segments.clear()
        return list(self._messages)

    def abort(self) -> list[str]:
        """Drop buffers, close and delete every file written so far; returns their paths.

        Safe after any error: every step is best effort and failures are only logged.
        """
        self._done = True
        try:
            self._encoder.shutdown()
        except Exception:  # the write failed anyway; its files are deleted below
            logger.debug("ignoring an encoding error while aborting", exc_info=True)
        for part in self._partitions.values():
            part.pieces.clear()
            part.buffered_bytes = 0
            if part.file is not None:
                _close_quietly(part.file)
                part.file = None
        self._open.clear()
        self._segments.clear()
        self._buffered_bytes = 0
        for path in self._paths:
            try:
                self._io.delete(path)
            except FileNotFoundError:
                pass
            except Exception:  # abort must go on deleting the rest (logged with the traceback)
                logger.warning("could not delete %s while aborting", path, exc_info=True)
        self._messages.clear()
        return list(self._paths)

    # -- writing row groups ---------------------------------------------------------------

    def _relieve_memory_pressure(self) -> None:
        """Past the limit, write out the partitions holding rows of the oldest segments
        until the buffered total is under half the limit.

        Going down to half (not just under the limit) means the next writes do not trigger
        another round of small row groups straight away; oldest first frees whole segments.
        """
        if self._buffered_bytes <= self._buffer_limit:
            return
        goal = self._buffer_limit // 2
        while self._buffered_bytes > goal and self._segments:
            oldest = next(iter(self._segments.values()))
            if not oldest.holders:
                self._drop_segment(oldest)
                continue
            for key in list(oldest.holders):
                self._flush(self._partitions[key])

    def _release_unheld(self) -> None:
        """Forget segments no partition holds rows of any more (all written)."""
        for segment in [s for s in self._segments.values() if not s.holders]:
            self._drop_segment(segment)

    def _drop_segment(self, segment: _Segment) -> None:
        if self._segments.pop(id(segment), None) is not None:
            self._buffered_bytes -= segment.nbytes

    def _flush(self, part: _Partition) -> None:
        """Write a partition's buffered rows into its current file as row groups."""
        if not part.pieces:
            return
        pieces, part.pieces, part.buffered_bytes = part.pieces, [], 0.0
        slices = [segment.table.slice(start, rows) for segment, start, rows in pieces]
        table = slices[0] if len(slices) == 1 else pa.concat_tables(slices)
        for segment, _, _ in pieces:
            segment.holders.discard(part.key)
            if not segment.holders:
                self._drop_segment(segment)
        file = part.file if part.file is not None else self._open_file(part)
        rows = table.num_rows
        sorts_at_flush = self._row_order is not None and not self._sort_on_arrival
        if self._row_order is not None and sorts_at_flush:
            # The file's rows sorted and written whole, then the file ends (later rows of
            # the partition go to the next file): a file is one sorted run.
            table = self._row_order.sort(table)
        # Normally one row group; an oversized buffer (one huge input table, or a sorted
        # file's) becomes several row groups of between 1x and 2x row_group_bytes.
        group_rows = math.ceil(rows / max(1, table.nbytes // self._row_group_bytes))
        for offset in range(0, rows, group_rows):
            self._write_row_group(part, file, table.slice(offset, group_rows))
        if sorts_at_flush:
            self._close_file(part)
            part.path = None
            part.assigned_rows = 0

    def _write_row_group(self, part: _Partition, file: _OpenFile, table: pa.Table) -> None:
        self._open.move_to_end(part.key)
        # The counters below are shared with the encoder thread: update them only while no
        # row group is in flight.
        self._encoder.wait()
        rows, nbytes = table.num_rows, table.nbytes
        file.rows += rows
        file.pending_arrow_bytes += nbytes
        add_counts(file.nan_counts, count_nans(table, self._iceberg_schema))

        def encode() -> None:
            with _naming(file.path):
                file.writer.write_table(table, row_group_size=rows)
            file.position = int(file.stream.tell())
            file.encoded_arrow_bytes += nbytes
            file.pending_arrow_bytes -= nbytes
            ratio = file.ratio()
            if ratio:
                self._ratio_hint = ratio

        self._encoder.submit(encode)

    def _open_file(self, part: _Partition) -> _OpenFile:
        if self._max_open_files is not None:
            while len(self._open) >= self._max_open_files:
                # Evicting a file ends it: its partition's later rows go to a new file.
                # (Its buffer is empty: buffers are only ever flushed into an open file.)
                self._roll(self._partitions[next(iter(self._open))])
        path = self._current_path(part)
        with _naming(path):
            stream = self._io.new_output(path).create(overwrite=True)
        self._paths.append(path)
        try:
            writer = pq.ParquetWriter(
                stream,
                self._arrow_schema,
                compression=self._compression,
                compression_level=self._compression_level,
                data_page_size=self._page_bytes,
                dictionary_pagesize_limit=self._dictionary_bytes,
                write_statistics=True,
                # Iceberg's Parquet mapping stores decimal(P<=18) as INT32/INT64, as Java does.
                store_decimal_as_integer=True,
                **({"bloom_filter_options": self._bloom_filters} if self._bloom_filters else {}),
                **({"sorting_columns": self._sorting_columns} if self._sorting_columns else {}),
            )
        except Exception:
            stream.close()
            raise
        part.file = _OpenFile(path=path, stream=stream, writer=writer)
        self._open[part.key] = None
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        return part.file

    def _close_file(self, part: _Partition) -> None:
        file = part.file
        assert file is not None
        self._encoder.wait()  # its last row group may still be encoding
        with _naming(file.path):
            file.writer.close()  # writes the footer
            metadata = file.writer.writer.metadata
            size = int(file.stream.tell())
            file.stream.close()
        # Detach only once closed, so abort() still closes the stream if closing failed.
        part.file = None
        self._open.pop(part.key, None)
        self._closed_rows += file.rows
        self._closed_bytes += size
        self._messages.append(
            data_file_message(
                path=file.path,
                spec_id=self._spec_id,
                partition_key=part.key,
                parquet_metadata=metadata,
                file_size=size,
                iceberg_schema=self._iceberg_schema,
                table_properties=self._table_properties,
                nan_counts=file.nan_counts,
                sort_order_id=self._row_order.order_id if self._row_order is not None else 0,
            )
        )


@contextmanager
def _naming(path: str) -> Iterator[None]:
    """An OS error while writing `path` (a full disk, a permission, a store's refusal) names
    the file: Arrow's own message often does not."""
    try:
        yield
    except OSError as exc:
        if path in str(exc):
            raise
        hint = "; the file system of the table's data location is full: free space there" if exc.errno == errno.ENOSPC else ""
        raise type(exc)(exc.errno, f"{exc.strerror or exc} (writing data file {path}{hint})") if exc.errno else OSError(
            f"{exc} (writing data file {path})"
        ) from exc


def _unpin(table: pa.Table) -> pa.Table:
    """Copy a slice that references far more memory than its own rows."""
    if table.get_total_buffer_size() > _PINNED_SLACK * table.nbytes + 64 * 1024:
        return table.take(pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table


def _close_quietly(file: _OpenFile) -> None:
    for close in (file.writer.close, file.stream.close):
        try:
            close()
        except Exception:  # best effort during abort (logged with the traceback)
            logger.debug("ignoring error while closing %s", file.path, exc_info=True)
