"""The Dash dashboard (findings next to the GPU timeline and memory_reserved): not built yet, see the issues."""
