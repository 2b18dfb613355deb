"""``ampmeter watch``: follow the logs (:mod:`.follow`), keep what they say (:mod:`.state`),
draw it (:mod:`.view`) and redraw it (:mod:`.live`); importing this package loads none of them."""
