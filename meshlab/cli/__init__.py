"""The command line: typer commands that parse, call the stages, and render with rich; nothing here plans or
prices."""
