"""Loading models by hub name or local path (tokenizers, model shapes) and the GPU runtime check; the tiny local
models are built in workers/tiny/."""
