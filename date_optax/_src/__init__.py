"""Implementation modules of date_optax; import the public names from `date_optax`."""
