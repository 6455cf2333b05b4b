"""One module per model source kind; `inspector.loaders.load.load_model` dispatches to them."""
