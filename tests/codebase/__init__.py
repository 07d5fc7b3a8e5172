"""The shape of the code base: imports at module top, layers pointing one way, file, function and folder sizes,
help text on every option."""
