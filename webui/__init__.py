"""The Chainlit side of app.py: our HTTP routes, the chat and compare renderers.

app.py keeps every Chainlit registration (handlers, callbacks, data layer) and hands these modules its Service
or settings as arguments: tests import app.py afresh with a new Service while this package stays imported, so
nothing here holds on to a Service, settings or a session at module level. backend/ never imports this package.
"""
