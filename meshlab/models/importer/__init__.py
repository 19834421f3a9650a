"""Building a model card from the real diffusers class: the card importer, the traces of one forward (dataflow,
elementwise bytes, the VAE decode), and the model and inputs builder the workers share (torch)."""
