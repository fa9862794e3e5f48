"""Subcommands beyond run/ops/list, one module each; ``cli.build_parser`` discovers them."""
