"""The model catalogue: every model this server can run, by name (the toy and the spec's models,
the models trained here and shipped in core/trained/, MiniLM, checkpoints in EXPLORER_MODELS_DIR,
and finished training runs), and the loading of Hugging Face checkpoints with its memory budget.

May import: `core`, `app.settings`, and of app.training its interface (`app.training.base`) and the factory
that opens the store (`app.training.open_store`): a finished training run is a model.
"""
