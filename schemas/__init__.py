"""The wire contract of jobwheel: Avro schemas, their codec, and the topic definitions.

Every other part imports this package; it imports none of them.
"""
