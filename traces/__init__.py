"""The data contract: Arrow schemas with a version, validating readers, crash-safe writers."""

from traces.schema import SCHEMA_VERSION, SCHEMAS, schema_of
from traces.checks import TraceError, Violation, check_trace
from traces.store import TraceWriter, read_run, read_table, to_table, write_tables

__all__ = ["SCHEMA_VERSION", "SCHEMAS", "schema_of", "TraceError", "TraceWriter", "Violation",
           "check_trace", "read_run", "read_table", "to_table", "write_tables"]
