"""``ampmeter demo``: a ReAct agent on a real local model, run under limits and accounted for.

:func:`ampmeter.demo.run.run_demo` runs it; :mod:`ampmeter.demo.settings` holds its questions
and limits. This package imports neither, so the CLI can show the demo's help without loading
llama.cpp's client.
"""
