"""The docs hold together: links, tables generated from records, the mkdocs site, docstring examples."""
