"""Built-in problem sets and loaders for public dataset formats (local files only)."""
