"""Operations: health, counts, metrics, hourly history and its charts, and the file sweep."""
