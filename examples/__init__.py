"""Small programs that show chainfb at work, run from the repository root as ``python -m examples.<name>``
(``--help`` says what each does):

- ``python -m examples.demo_numerator``: forward-backward of an example numerator graph on random scores;
- ``python -m examples.demo_chain``: end-to-end LF-MMI training on synthetic data."""
