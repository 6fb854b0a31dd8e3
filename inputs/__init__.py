"""The input layer beneath every package: the strict model base and its one-line errors
(`inputs.strict`) and every cap an input is checked against (`inputs.limits`)."""
