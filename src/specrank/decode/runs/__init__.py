"""Runs over prompt sets: the recorder, lossy verification runs and the online speed protocol, written through one
resumable shard writer into a run directory."""

from specrank.decode.runs.lossy import lossy_decode_run, read_diagnostics
from specrank.decode.runs.manifest import build_manifest
from specrank.decode.runs.measure import Measure, parse_strategies
from specrank.decode.runs.protocol import run_protocol
from specrank.decode.runs.recorder import record_prompt, record_run
from specrank.decode.runs.shards import RunDirError
from specrank.decode.runs.tables import read_rounds, rounds_table

__all__ = ["Measure", "RunDirError", "build_manifest", "lossy_decode_run", "parse_strategies", "read_diagnostics",
           "read_rounds", "record_prompt", "record_run", "rounds_table", "run_protocol"]
