"""Stage 1, data: dialogues and pair files in, positive (context, response) pairs and their negatives out.

``records`` reads and writes tables (CSV, TSV, JSONL, JSON) with errors naming file, row and field;
``dialogues`` loads conversations from any source; ``pairs`` cuts them into context-response pairs;
``negatives`` draws mismatched responses; ``conversation`` turns chat messages and templated text into
the scorer's text and back; ``words`` splits text into words (each letter of a script written without spaces
one); ``synthetic`` builds data with known PMI.
"""
