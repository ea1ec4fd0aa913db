"""Pictures of attention: heatmaps and TensorBoard views (:mod:`~nmt.viz.visualize`), the
explorer page (:mod:`~nmt.viz.explorer` with its template ``explorer.html``) and
``nmt-attention`` (:mod:`~nmt.viz.plot_attention`). May import everything up to
:mod:`nmt.decode`, and :mod:`nmt.evaluate`.
"""
