"""The instructor's course tools: the gradebook, the nbgrader course folder and what leaves it.

* `submissions`: finding the learners' notebooks in a folder, one per learner;
* `deadlines`: due dates, submission times and late penalties;
* `course_config`: the course's `course.toml` (roster, due dates, penalties);
* `gradebook`: nbgrader's gradebook, written by the grader;
* `nbgrader_course`: the nbgrader course folder (source, release, submitted, feedback);
* `export`, `lms`: grades and feedback out, as CSV, HTML and LMS files;
* `release`, `learners_release`, `release_search`: what learners get, and the search that
  keeps solutions and hidden tests out of it;
* `similarity`, `fingerprints`: the similarity report between learners' answers;
* `gradescope`: Gradescope's autograder, in its container.

It may import: core, isolation, authoring, grading, learner.
"""
