"""Data layer: TOFU splits (local JSON, hub or built-in synthetic), pretraining corpora, speech manifests.

Import the submodules directly (``mmunlearn.data.tofu``, ``mmunlearn.data.synthetic``, ...); this
package imports nothing eagerly so that each loader pulls in only its own dependencies.
"""
