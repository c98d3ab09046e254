"""One write, many tables: rows routed to the table a column names (`table_column`)."""
