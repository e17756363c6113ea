import pytest

import reconq


@pytest.fixture
def q():
    queue = reconq.WorkQueue()
    yield queue
    queue.shut_down()
