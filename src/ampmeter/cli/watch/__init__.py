"""``ampmeter watch``: a live terminal view of JSONL logs while they are being written.

:class:`~ampmeter.cli.watch.follow.LogFollower` reads what one or many processes append to the
logs (and files that appear later in a directory or under a glob),
:class:`~ampmeter.cli.watch.state.WatchState` turns the events into call trees and usage
against ceilings, :func:`~ampmeter.cli.watch.view.render_frame` draws them with rich, and
:func:`~ampmeter.cli.watch.live.watch` redraws them. Importing this package imports none of
them (the command loads them when it runs).
"""
