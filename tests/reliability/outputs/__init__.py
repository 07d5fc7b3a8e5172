"""What mmunlearn writes: never into an input, no original weights shipped, no non-finite weights, side files."""
