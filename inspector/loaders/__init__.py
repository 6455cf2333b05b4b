"""One module per model source kind; `inspector.loading.load_model` dispatches to them."""
