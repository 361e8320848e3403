"""The package's command-line tools, installed as console scripts (``[options.entry_points]`` in setup.cfg):

- ``chainfb-make-den-graph`` (:mod:`chainfb.cli.make_den_graph`): the LF-MMI denominator graph of a lexicon and
  transcripts;
- ``chainfb-make-numerator-graphs`` (:mod:`chainfb.cli.make_numerator_graphs`): an archive of numerator graphs;
- ``chainfb-draw-transducer`` (:mod:`chainfb.cli.draw_transducer`): Graphviz drawings of small transducer graphs.

Each is also ``python -m chainfb.cli.<module>``; ``--help`` lists its options."""
